"""The parts of an incident's verdict read from its alerts' labels: the culprit, the causal joins, the action and
the blast radius (``alerts.incidents`` assembles them; ``alerts.causes`` names the joins and actions)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpulens.alerts.causes import DEFAULT_ACTION, OWN_CULPRIT, RULE_ACTIONS
from gpulens.alerts.names import COMMUNICATION_STALL, XID_ERROR
from gpulens.xidcatalogue import xid_action


class Alertish(Protocol):
    @property
    def rule(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...


@dataclass(frozen=True, slots=True)
class Culprit:
    """The lowest-layer cause of an incident: a GPU, a port, a rank, a node or a job."""

    kind: str  # "gpu" | "port" | "rank" | "node" | "job"
    node: str | None = None
    gpu: int | None = None
    uuid: str | None = None
    pci: str | None = None
    device: str | None = None
    port: str | None = None
    job_id: str | None = None
    rank: int | None = None

    @property
    def key(self) -> str:
        """What identifies the culprit (two alerts with the same key name one culprit)."""
        if self.kind == "gpu":
            where = self.uuid or f"{self.node}:{self.gpu if self.gpu is not None else self.pci}"
            return f"gpu/{where}"
        if self.kind == "port":
            return f"port/{self.node}/{self.device}/{self.port}"
        if self.kind == "rank":
            return f"rank/{self.job_id}/{self.rank}"
        if self.kind == "node":
            return f"node/{self.node}"
        return f"job/{self.job_id}"

    @property
    def text(self) -> str:
        """``GPU node-02:3``, ``port node-01 mlx5_2/1``, ``rank 24 of job llm (node-02:3)``, ``node node-04``."""
        if self.kind == "gpu":
            where = f"{self.node}:{self.gpu}" if self.gpu is not None else f"{self.node} {self.pci or self.uuid}"
            return f"GPU {where}"
        if self.kind == "port":
            return f"port {self.node} {self.device}/{self.port or 1}"
        if self.kind == "rank":
            return f"rank {self.rank} of job {self.job_id} ({self.node}:{self.gpu})"
        if self.kind == "node":
            return f"node {self.node}"
        return f"job {self.job_id}"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "node": self.node,
            "gpu": self.gpu,
            "uuid": self.uuid,
            "pci": self.pci,
            "device": self.device,
            "port": self.port,
            "job_id": self.job_id,
            "rank": self.rank,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Culprit:
        def text(key: str) -> str | None:
            value = d.get(key)
            return None if value is None else str(value)

        def number(key: str) -> int | None:
            value = d.get(key)
            return None if value is None else int(value)

        return cls(
            kind=str(d["kind"]),
            node=text("node"),
            gpu=number("gpu"),
            uuid=text("uuid"),
            pci=text("pci"),
            device=text("device"),
            port=text("port"),
            job_id=text("job_id"),
            rank=number("rank"),
        )


def split(value: str | None) -> list[str]:
    """A label that may list several values (``job_id="a,b"``)."""
    return [v for v in (value or "").split(",") if v]


def _int(value: str | None) -> int | None:
    try:
        return None if value is None or value == "" else int(value)
    except ValueError:
        return None


def stuck_ranks(stuck_at: str) -> list[tuple[int | None, str, int | None]]:
    """``24@node-02:3,25@node-02:4`` -> [(24, "node-02", 3), ...]."""
    out = []
    for item in split(stuck_at):
        rank, _, where = item.partition("@")
        node, _, gpu = where.rpartition(":")
        out.append((_int(rank), node, _int(gpu)))
    return out


def _stuck_at(a: Alertish) -> str:
    notes = getattr(a, "annotations", None)
    if isinstance(notes, Mapping):
        return str(notes.get("stuck_at", ""))
    return str(getattr(a, "stuck_at", ""))


def culprit_of(a: Alertish) -> Culprit:
    """The culprit an alert names by itself (where nothing explains it)."""
    labels = a.labels
    node = labels.get("node") or None
    kind = OWN_CULPRIT.get(a.rule)
    stuck = stuck_ranks(_stuck_at(a)) if a.rule == COMMUNICATION_STALL else []
    if kind is None:
        if labels.get("device"):
            kind = "port"
        elif labels.get("gpu") or labels.get("uuid") or labels.get("pci_bus_id"):
            kind = "gpu"
        elif stuck:
            kind = "rank"
        elif labels.get("job_id"):
            kind = "job"
        else:
            kind = "node"
    if kind == "port":
        return Culprit("port", node=node, device=labels.get("device"), port=labels.get("port") or "1")
    if kind == "gpu":
        return Culprit(
            "gpu", node=node, gpu=_int(labels.get("gpu")), uuid=labels.get("uuid"), pci=labels.get("pci_bus_id")
        )
    if kind == "rank":
        rank, where, gpu = stuck[0]
        return Culprit("rank", node=where or None, gpu=gpu, job_id=labels.get("job_id"), rank=rank)
    if kind == "node":
        return Culprit("node", node=node or next(iter(split(labels.get("nodes"))), None))
    return Culprit("job", job_id=labels.get("job_id"))


def _nodes(labels: Mapping[str, str]) -> set[str]:
    """The nodes an alert is on: its ``nodes`` and ``node`` labels (a job's ``node`` may list several)."""
    return set(split(labels.get("nodes"))) | set(split(labels.get("node")))


def explains(join: str, cause: Alertish, effect: Alertish) -> bool:
    """Whether ``join`` (``causes.JOINS``) holds between a cause and an effect alert."""
    c, e = cause.labels, effect.labels
    if join == "job_on_gpu":
        jobs = set(split(e.get("job_id")))
        if jobs & set(split(c.get("job_id"))):
            return True
        return not c.get("gpu") and not c.get("uuid") and bool(c.get("node")) and c["node"] in _nodes(e)
    if join == "stuck_gpu":
        if e.get("signature") not in ("rank_dead", "rank_missing"):
            return False
        return any(
            node == c.get("node") and str(gpu) == c.get("gpu") for _, node, gpu in stuck_ranks(_stuck_at(effect))
        )
    if join == "named_gpu":
        same_gpu = bool(c.get("gpu")) and c.get("gpu") == e.get("gpu") and c.get("node") == e.get("node")
        return same_gpu or (bool(c.get("uuid")) and c.get("uuid") == e.get("uuid"))
    if join == "port_job":
        return bool(set(split(c.get("job_id"))) & set(split(e.get("job_id"))))
    if join == "node":
        return bool(c.get("node")) and c["node"] in _nodes(e)
    raise ValueError(f"unknown join {join!r}")


def action_of(rule: str, labels: Mapping[str, str]) -> str:
    """A rule's action in the catalogue's vocabulary (``XidError``: its code's)."""
    if rule == XID_ERROR and (code := _int(labels.get("xid"))) is not None:
        return xid_action(code)
    return RULE_ACTIONS.get(rule, DEFAULT_ACTION)


def jobs_of(members: Iterable[Alertish], culprit: Culprit) -> tuple[str, ...]:
    jobs = {j for m in members for j in split(m.labels.get("job_id"))}
    if culprit.job_id:
        jobs.add(culprit.job_id)
    return tuple(sorted(jobs))


def users_of(members: Sequence[Alertish]) -> tuple[str, ...]:
    return tuple(sorted({u for m in members for u in split(m.labels.get("user"))}))
