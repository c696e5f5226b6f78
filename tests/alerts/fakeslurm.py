"""A stand-in for Slurm's commands, the runner the remediation actions take: ``sinfo`` lists its nodes, ``scontrol
update`` drains and resumes them, ``scontrol requeue`` records the job. Every call is kept (``calls``); a node name
is taken as Slurm would take a host list, so a test can show that none ever reaches it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Node:
    state: str = "idle"
    reason: str = ""
    features: tuple[str, ...] = ()


@dataclass
class FakeSlurm:
    nodes: dict[str, Node] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)
    fail_for: set[str] = field(default_factory=set)  # node names whose scontrol update fails (once each)

    @classmethod
    def of(cls, count: int, prefix: str = "n") -> FakeSlurm:
        return cls({f"{prefix}{i:02d}": Node() for i in range(1, count + 1)})

    def __call__(self, argv: Sequence[str], timeout_s: float) -> str:
        self.calls.append(list(argv))
        if argv[0] == "sinfo":
            lines = [
                f"{name}|{n.state}|{','.join(n.features) or '(null)'}|{n.reason or 'none'}"
                for name, n in self.nodes.items()
            ]
            return "\n".join(lines) + "\n"
        if argv[:2] == ["scontrol", "requeue"]:
            return ""
        assert argv[:2] == ["scontrol", "update"], argv
        name = argv[2].removeprefix("NodeName=")
        if name in self.fail_for:
            self.fail_for.discard(name)
            raise OSError(f"scontrol exited 1: cannot reach slurmctld for {name}")
        if name not in self.nodes:
            raise OSError(f"scontrol exited 1: Invalid node name specified {name}")
        node = self.nodes[name]
        if argv[3] == "State=DRAIN":
            node.state, node.reason = "drained", argv[4].removeprefix("Reason=")
        elif argv[3] == "State=RESUME":
            node.state, node.reason = "idle", ""
        return ""

    def updates(self) -> list[list[str]]:
        return [c for c in self.calls if c[:2] == ["scontrol", "update"]]

    def drained(self) -> set[str]:
        return {name for name, n in self.nodes.items() if "drain" in n.state}
