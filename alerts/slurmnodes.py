"""Slurm's nodes as remediation sees them, read from ``sinfo``, and the check every node name passes before it
reaches Slurm.

A node name comes from an alert label, and an alert label from a page anyone on a node could serve: it is input.
Slurm's commands read a host-list expression (``n[01-40]``, ``n01,n02``) wherever they take a node, so a name that
reaches ``scontrol`` must be exactly one node Slurm knows: ``NODE_NAME`` (one host name, no brackets, commas or
spaces) and present in ``sinfo``'s own list. Anything else is refused by ``refuse_name``.

``sinfo -h -N -o '%N|%T|%f|%E'`` prints one line per node and partition: name, state (``idle``, ``drained``,
``draining``, ``down*``, ``mixed+drain``…), features and the drain reason (``none`` when there is none); the output
is capped at ``MAX_SINFO_BYTES``.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

Runner = Callable[[Sequence[str], float], str]

NODE_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
SINFO_FORMAT: Final = "%N|%T|%f|%E"
MAX_SINFO_BYTES: Final = 16 * 1024 * 1024
OURS: Final = "gpulens:"  # the prefix of every drain reason gpulens gives


@dataclass(frozen=True)
class SlurmNode:
    name: str
    state: str  # lower case, as sinfo's %T
    features: frozenset[str]
    reason: str  # "" when none

    @property
    def down(self) -> bool:
        return "down" in self.state

    @property
    def drained(self) -> bool:
        return "drain" in self.state

    @property
    def ours(self) -> bool:
        """Drained by gpulens (its reason's prefix)."""
        return self.drained and self.reason.startswith(OURS)


def run_command(argv: Sequence[str], timeout_s: float) -> str:
    """Run ``argv`` (never a shell); its standard output. Raises ``OSError`` naming the failure."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise OSError(f"{argv[0]} did not answer within {timeout_s:g} s") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise OSError(f"{argv[0]} exited {done.returncode}: {lines[-1] if lines else 'no output'}")
    return done.stdout[:MAX_SINFO_BYTES]


def parse_sinfo(text: str) -> dict[str, SlurmNode]:
    """Node name -> node from ``sinfo -h -N -o '%N|%T|%f|%E'``; a line of another shape is skipped."""
    nodes: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        fields = line.split("|", 3)
        if len(fields) != 4 or not NODE_NAME.fullmatch(fields[0]):
            continue
        name, state, features, reason = fields
        found = frozenset(f for f in features.split(",") if f and f != "(null)")
        nodes[name] = SlurmNode(name, state.strip().lower(), found, "" if reason.strip() == "none" else reason.strip())
    return nodes


def read_nodes(run: Runner, sinfo: str, timeout_s: float) -> dict[str, SlurmNode]:
    """Slurm's nodes now. Raises ``OSError`` where sinfo fails or lists none."""
    nodes = parse_sinfo(run([sinfo, "-h", "-N", "-o", SINFO_FORMAT], timeout_s))
    if not nodes:
        raise OSError(f"{sinfo} listed no nodes")
    return nodes


def refuse_name(name: str, nodes: Mapping[str, SlurmNode] | None) -> str:
    """Why ``name`` must not reach Slurm ("" where it is exactly one node Slurm lists; ``nodes`` None: the shape
    alone is checked)."""
    if not name:
        return "the alert names no node"
    shown = name if len(name) <= 64 else name[:64] + "…"
    if not NODE_NAME.fullmatch(name):
        return f"node {shown!r} is not one node name (a host list or another expression is never passed to Slurm)"
    if nodes is not None and name not in nodes:
        return f"node {shown!r} is not one of Slurm's nodes (sinfo)"
    return ""


def drain_argv(scontrol: str, node: str, reason: str) -> list[str]:
    return [scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]


def resume_argv(scontrol: str, node: str) -> list[str]:
    return [scontrol, "update", f"NodeName={node}", "State=RESUME"]


SLURM_JOB_ID: Final = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9})?")


def requeue_argv(scontrol: str, job_id: str) -> list[str]:
    return [scontrol, "requeue", job_id]
