"""Which GPUs are hung, not busy, as the alert engine judged them: a hung GPU can read 100 % utilization (its kernels
spin in a collective that never completes), so the overview marks it by the alerts, never by its readings.

A GPU is hung when a ``CommunicationStall`` (any signature: spinning, blocked, mixed, ``rank_dead``,
``rank_missing``) pending or firing names a job that holds it, or a ``GpuDriverHung`` names its node (the driver of
every GPU there is wedged). Pure: the pages pass the alerts and the GPUs' jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpulens.alerts.names import COMMUNICATION_STALL, GPU_DRIVER_HUNG
from gpulens.alerts.state import AlertState
from gpulens.dashboard.flags import alert_jobs
from gpulens.model import GpuJob


@dataclass(frozen=True, slots=True)
class Hang:
    """Why a GPU is hung: the alert that says so, the job it stalls (None for a hung driver), and since when."""

    rule: str
    job_id: str | None
    signature: str | None
    began: float
    firing: bool


def hangs(alerts: Iterable[AlertState]) -> tuple[dict[str, Hang], dict[str, Hang]]:
    """The stalled jobs (job_id -> its hang) and the nodes whose driver hangs (node -> its hang), from the alerts
    pending or firing."""
    jobs: dict[str, Hang] = {}
    nodes: dict[str, Hang] = {}
    for a in alerts:
        if a.state not in ("pending", "firing"):
            continue
        if a.rule == COMMUNICATION_STALL:
            for job in alert_jobs(a.labels):
                jobs[job] = Hang(a.rule, job, a.labels.get("signature"), a.began, a.state == "firing")
        elif a.rule == GPU_DRIVER_HUNG and a.labels.get("node"):
            nodes[a.labels["node"]] = Hang(a.rule, None, None, a.began, a.state == "firing")
    return jobs, nodes


def hung_gpus(alerts: Iterable[AlertState], gpus: Sequence[tuple[str, str, Sequence[GpuJob]]]) -> Mapping[str, Hang]:
    """uuid -> why it is hung, for each of ``gpus`` (uuid, node, the jobs holding it) that a hang names."""
    jobs, nodes = hangs(alerts)
    out: dict[str, Hang] = {}
    for uuid, node, held in gpus:
        hang = next((jobs[j.job_id] for j in held if j.job_id in jobs), None) or nodes.get(node)
        if hang is not None:
            out[uuid] = hang
    return out


def hang_text(hang: Hang) -> str:
    """``hung: job llm-pretrain stalled (CommunicationStall, spinning)``: the line a hover or a banner says."""
    if hang.job_id is None:
        return f"hung: the node's GPU driver does not answer ({hang.rule})"
    kind = f"{hang.rule}, {hang.signature}" if hang.signature else hang.rule
    return f"hung: job {hang.job_id} stalled ({kind}{'' if hang.firing else ', pending'})"
