"""The alert engine's reads over Prometheus: every GPU's few *round fields*, and the GPUs a PromQL filter names.

A rule round over Prometheus (``gpulens.alerts.promround``) reads, for every GPU, only what the rules need of every
GPU every round (``ROUND_FIELDS``: what the job detectors summarise, the counters the hardware-error rules compare
across their window, ``up``) and its *set* clock reasons (``gpulens_gpu_throttle_active != 0``: one series per reason
that is set, none on most GPUs); every other field it reads only for the GPUs a rule could fire on, named by PromQL
filters (``uuids_where``). Both read gpulens families; over dcgm-exporter families the round reads every GPU whole
(``PromReader.latest_readings``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

from gpulens.metriccatalogue import GPU_FIELDS
from gpulens.model import GpuReading
from gpulens.storage.prometheus import families as fam
from gpulens.storage.prometheus.client import PromSeries, regex_of

if TYPE_CHECKING:
    from gpulens.storage.prometheus.reader import PromReader

# What the rules read of every GPU every round: the job summaries' fields (``alerts.jobround.summarise_job``), the
# counters compared across a rule's window (PCIe replays, NVLink errors, uncorrectable ECC errors, XIDs), the row
# remapping failure, the power limit (``GpuPowerCapped`` holds its judgement on a GPU pausing) and ``up``.
# Everything else a rule reads is read only for the GPUs a filter names.
ROUND_FIELDS: Final = (
    "utilization_ratio",
    "memory_used_bytes",
    "power_watts",
    "power_limit_watts",
    "sm_active_ratio",
    "sm_clock_hertz",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
    "pcie_replays_total",
    "nvlink_crc_flit_errors_total",
    "nvlink_replay_errors_total",
    "nvlink_recovery_errors_total",
    "ecc_uncorrected_errors_total",
    "remapped_rows_failure",
)
# The slowdown clock reasons that are set (the only ones a rule weighs of a GPU it does not read whole): a GPU with
# none reads ``throttle_reasons = None``, which every rule reads as 0.
SLOWDOWN_REASONS: Final = ("hw_power_brake", "hw_slowdown", "hw_thermal", "sw_power_cap", "sw_thermal")
SET_REASONS: Final = f"{fam.THROTTLE}{{reason=~{regex_of(SLOWDOWN_REASONS)}}} != 0"


def round_selectors(fields: Iterable[str]) -> list[str]:
    """One selector per family for ``fields``: the family's constant labels that tell the fields apart matched as
    a set (``gpulens_gpu_clock_hertz{clock=~"sm"}``), or none where every series of the family is wanted."""
    wanted = set(fields)
    by_family: dict[str, list[tuple[tuple[str, str], ...]]] = {}
    every: dict[str, int] = {}
    for spec in GPU_FIELDS:
        every[spec.family] = every.get(spec.family, 0) + 1
        if spec.field in wanted:
            by_family.setdefault(spec.family, []).append(spec.labels)
    out = []
    for family, labels in sorted(by_family.items()):
        keys = {k for held in labels for k, _ in held}
        if len(labels) == every[family] or len(keys) != 1:
            out.append(family)
            continue
        (key,) = keys
        out.append(f"{family}{{{key}=~{regex_of(v for held in labels for k, v in held)}}}")
    return out


def round_readings(reader: PromReader, *, max_age_s: float, fields: Sequence[str] = ROUND_FIELDS) -> list[GpuReading]:
    """Every GPU's ``fields``, ``up``, XID counts and set clock reasons (gpulens families), newer than
    ``max_age_s``: one query per family, at once."""
    now = reader.clock.now()
    queries = [fam.UP, fam.XIDS, SET_REASONS, *round_selectors(fields)]
    answers: list[list[PromSeries]] = reader.parallel(
        *[lambda q=q: reader.client.query(q, now) for q in queries],
        lambda: reader.sample_times(f"timestamp({fam.UP})", "uuid", now),
    )
    times: dict[str, float] = answers.pop()  # type: ignore[assignment]
    readings = fam.gpulens_readings([s for answer in answers for s in answer], times, now)
    return sorted((r for r in readings if r.timestamp >= now - max_age_s), key=lambda r: (r.node, r.gpu))


def uuids_where(reader: PromReader, filters: Sequence[str]) -> set[str]:
    """The GPUs (``uuid``) that any of the PromQL ``filters`` returns a series for: one query."""
    if not filters:
        return set()
    promql = "group by (uuid) (" + " or ".join(f"({f})" for f in filters) + ")"
    return {s.labels["uuid"] for s in reader.client.query(promql, reader.clock.now()) if s.labels.get("uuid")}
