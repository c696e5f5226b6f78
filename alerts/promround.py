"""Rule rounds over Prometheus that read whole only the GPUs a rule could fire on.

``prom_round`` builds the same ``RoundResult`` as ``storeround.store_round`` with the same alerts, reading less:

* every GPU's *round fields* (``storage.prometheus.alertread.ROUND_FIELDS``: what the job detectors summarise, the
  counters the error rules compare across their window, the power limit, ``up``) and its set slowdown reasons, so
  the history, the job summaries, the stall and straggler detectors, ``GpuIdleAllocated`` and ``GpuLost`` see exactly
  what a whole read gives them;
* the other fields only for the GPUs that a rule could fire on, read whole: those that ``gpu_filters`` names (one
  PromQL query: each threshold rule's condition, loosened by a rounding margin), those whose round fields say so
  (``named_here``: clock reasons, power against its limit, told in gpulens: in PromQL the joins cost Prometheus more
  than the reads), and the GPUs of the engine's pending and firing alerts of those rules.

A rule a filter does not know (a user threshold rule) or a store that holds dcgm-exporter families makes the round
read every GPU whole (``store_round``): ``whole_reads_needed``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from gpulens.alerts.base import AlertRule
from gpulens.alerts.catalogue import (
    COMMUNICATION_STALL,
    ECC_UNCORRECTABLE,
    EXPORTER_DOWN,
    GPU_LOST,
    HW_POWER_BRAKE,
    IDLE_ALLOCATED,
    JOB_INEFFICIENT,
    JOB_STRAGGLER,
    MEMORY_SATURATED,
    NVLINK_ERRORS,
    NVLINK_SATURATED,
    PCIE_DEGRADED,
    PCIE_SATURATED,
    POWER_CAPPED,
    THERMAL_THROTTLING,
    WATCHDOG,
    XID_ERROR,
)
from gpulens.alerts.checks import HW_POWER_BRAKE_BIT, HW_SLOWDOWN, SW_POWER_CAP, THERMAL_BITS
from gpulens.alerts.fabriccatalogue import FABRIC_RULES
from gpulens.alerts.state import FIRING, PENDING, AlertState
from gpulens.alerts.storeround import assemble_round, store_round
from gpulens.model import GpuReading
from gpulens.rounds import RoundResult
from gpulens.storage.prometheus import PromReader
from gpulens.storage.prometheus import families as fam
from gpulens.storage.prometheus.alertread import round_readings, round_selectors, uuids_where
from gpulens.storage.prometheus.client import regex_of
from gpulens.storage.prometheus.families import field_selector, pcie_ceiling

# Thresholds are loosened by this share so that a float rounded differently in Prometheus never hides a GPU.
SLACK: Final = 1 - 1e-6
# Rules that read nothing beyond the round fields (or nothing from Prometheus: the fabric's)
ROUND_FIELD_RULES: Final = frozenset(
    {IDLE_ALLOCATED, GPU_LOST, EXPORTER_DOWN, COMMUNICATION_STALL, JOB_STRAGGLER, JOB_INEFFICIENT, WATCHDOG}
    | {rule.name for rule in FABRIC_RULES}
)


def _changed(fields: Sequence[str], window_s: float) -> str:
    """PromQL: the counters of ``fields`` that changed within ``window_s``."""
    return " or ".join(f"changes({s}[{math.ceil(window_s)}s]) > 0" for s in round_selectors(fields))


def _filter(rule: AlertRule, margin_s: float) -> str | None:
    """PromQL naming every GPU ``rule`` could fire on (a superset of its condition); None for a rule that needs no
    more than the round fields."""
    name = rule.check or rule.name
    sel = field_selector
    pcie = f"max by (uuid) ({sel('pcie_tx_bytes_per_second')} or {sel('pcie_rx_bytes_per_second')})"
    nvlink = f"max by (uuid) ({sel('nvlink_tx_bytes_per_second')} or {sel('nvlink_rx_bytes_per_second')})"
    if name == MEMORY_SATURATED:
        limit = rule.threshold("used_ratio") * SLACK
        return f"{sel('memory_used_bytes')} / on (uuid) {sel('memory_total_bytes')} >= {limit!r}"
    if name == THERMAL_THROTTLING:
        margin = rule.threshold("margin_celsius") + 0.001
        return f"{sel('temperature_celsius')} >= on (uuid) ({sel('slowdown_temperature_celsius')} - {margin!r})"
    if name == PCIE_SATURATED:
        return f"{pcie} >= on (uuid) ({pcie_ceiling('max')} * {rule.threshold('utilization_ratio') * SLACK!r})"
    if name == NVLINK_SATURATED:
        share = rule.threshold("utilization_ratio") * rule.threshold("link_bytes_per_second") * SLACK
        return f"{nvlink} >= on (uuid) ({sel('nvlink_links_active')} * {share!r})"
    if name == PCIE_DEGRADED:
        # a generation below its maximum counts only while the GPU is busy; the filter names it busy or not (the
        # GPU is then read whole and judged): the busy test's ceiling join cost Prometheus more than all the rest
        narrow = f"{sel('pcie_link_width')} < on (uuid) {sel('pcie_link_width_max')}"
        slow = f"{sel('pcie_link_generation')} < on (uuid) {sel('pcie_link_generation_max')}"
        replays = _changed(["pcie_replays_total"], rule.threshold("window_s") + margin_s)
        return f"{narrow} or {slow} or {replays}"
    if name == NVLINK_ERRORS:
        counters = ["nvlink_crc_flit_errors_total", "nvlink_replay_errors_total", "nvlink_recovery_errors_total"]
        return _changed(counters, rule.threshold("window_s") + margin_s)
    if name == ECC_UNCORRECTABLE:
        changed = _changed(["ecc_uncorrected_errors_total"], rule.threshold("window_s") + margin_s)
        return f"{changed} or {sel('remapped_rows_failure')} != 0"
    if name == XID_ERROR:
        xids = f"{fam.XIDS}{{xid=~{regex_of(sorted(rule.codes('codes')))}}}"
        window = f"{math.ceil(rule.threshold('window_s') + margin_s)}s"
        return f"changes({xids}[{window}]) > 0 or ({xids} unless {xids} offset {window})"
    return None


def _named_here(rule: AlertRule, reading: GpuReading) -> bool:
    """Whether ``rule`` could fire on the GPU of this round-field reading, for the part of its condition that the
    round fields tell (its clock reasons, power and power limit): no PromQL needed."""
    name = rule.check or rule.name
    bits = reading.throttle_reasons or 0
    if name == THERMAL_THROTTLING:
        return bool(bits & (THERMAL_BITS | HW_SLOWDOWN))
    if name == HW_POWER_BRAKE:
        return bool(bits & HW_POWER_BRAKE_BIT)
    if name == POWER_CAPPED and bits & SW_POWER_CAP and reading.power_watts is not None:
        limit = reading.power_limit_watts
        return not limit or reading.power_watts >= rule.threshold("power_ratio") * SLACK * limit
    return False


def named_here(rules: Sequence[AlertRule], readings: Iterable[GpuReading]) -> set[str]:
    """The GPUs whose round fields say a rule could fire on them (``_named_here``)."""
    judged = [r for r in rules if (r.check or r.name) in (THERMAL_THROTTLING, HW_POWER_BRAKE, POWER_CAPPED)]
    return {g.uuid for g in readings if g.throttle_reasons and any(_named_here(r, g) for r in judged)}


def gpu_filters(rules: Iterable[AlertRule], *, margin_s: float) -> list[str]:
    """Each rule's filter (see ``_filter``); ``margin_s``: how much older than a rule's window the reading that
    starts it may be (the round's ``max_age_s`` and a scrape)."""
    return [f for rule in rules if (f := _filter(rule, margin_s)) is not None]


def whole_reads_needed(store: PromReader, rules: Iterable[AlertRule]) -> bool:
    """Whether a round must read every GPU whole: a rule no filter knows, or dcgm-exporter families in the store
    (the filters are written over gpulens families)."""
    names = store.present_names()
    if names is None or names & set(fam.DCGM_PRESENCE):
        return True
    known = ROUND_FIELD_RULES | {
        MEMORY_SATURATED,
        THERMAL_THROTTLING,
        POWER_CAPPED,
        HW_POWER_BRAKE,
        PCIE_SATURATED,
        NVLINK_SATURATED,
        PCIE_DEGRADED,
        NVLINK_ERRORS,
        ECC_UNCORRECTABLE,
        XID_ERROR,
    }
    return any((rule.check or rule.name) not in known for rule in rules)


def watched_gpus(states: Mapping[str, AlertState]) -> set[str]:
    """The GPUs of pending and firing alerts of the rules that read more than the round fields: read whole every
    round, so that each is judged as a whole read would judge it (the others are, from the round fields)."""
    return {
        uuid
        for s in states.values()
        if s.state in (PENDING, FIRING) and s.rule not in ROUND_FIELD_RULES and (uuid := s.labels.get("uuid"))
    }


def prom_round(
    store: PromReader,
    now: float,
    *,
    max_age_s: float,
    rules: Sequence[AlertRule],
    watched: Iterable[str] = (),
) -> RoundResult:
    """The cluster now, as one round (see the module's docstring)."""
    filters = gpu_filters(rules, margin_s=max_age_s + 2 * store.min_step_s)
    readings, named, jobs, targets = store.parallel(
        lambda: round_readings(store, max_age_s=max_age_s),
        lambda: uuids_where(store, filters),
        store.current_jobs,
        store.target_health,
    )
    detail = sorted(set(named) | named_here(rules, readings) | set(watched))
    if detail:
        whole = {r.uuid: r for r in store.latest_readings(uuids=detail, max_age_s=max_age_s)}
        readings = [whole.get(r.uuid, r) for r in readings]
    return assemble_round(store.backend, now, readings, jobs, [], targets)


def round_reader(
    store: PromReader, rules: Sequence[AlertRule], states: Callable[[], Mapping[str, AlertState] | None]
) -> Callable[[float, float], RoundResult]:
    """``read(now, max_age_s)`` for ``storeround.run_store_rules``: ``prom_round`` with the GPUs of the engine's
    alerts (``states()``, as the engine holds them at each round), or ``store_round`` where whole reads are needed
    or the engine's states are not known yet (``states()`` is None: before its first round)."""

    def read(now: float, max_age_s: float) -> RoundResult:
        held = states()
        if held is None or whole_reads_needed(store, rules):
            return store_round(store, now, max_age_s=max_age_s)
        return prom_round(store, now, max_age_s=max_age_s, rules=rules, watched=watched_gpus(held))

    return read
