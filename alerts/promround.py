"""Rule rounds over Prometheus that read whole only the GPUs a rule could fire on.

``prom_round`` builds the same ``RoundResult`` as ``storeround.store_round`` with the same alerts, reading less:

* every GPU's *round fields* (``storage.prometheus.alertread.ROUND_FIELDS``: what the job detectors summarise, the
  counters the error rules compare across their window, ``up``) and its set slowdown reasons, so the history, the
  job summaries, the stall and straggler detectors, ``GpuIdleAllocated`` and ``GpuLost`` see exactly what a whole
  read gives them;
* the other fields only for the GPUs that a rule could fire on, read whole:
  - those that ``gpu_filters`` names (a PromQL query each, at once: a PCIe link below its maximum, a failed row
    remapping);
  - those whose round fields say so (``named_here``: clock reasons, temperature, memory used, PCIe and NVLink
    traffic, against the GPU's constants, ``alertread.GpuFacts``: in PromQL the joins cost Prometheus more than the
    reads);
  - those whose error counters changed within a rule's window, as the engine's history tells
    (``counters_changed``);
  - the GPUs of the engine's pending and firing alerts of those rules.

Each threshold is loosened by a rounding margin (``SLACK``): a filter may name more GPUs than fire, never fewer.

A rule a filter does not know (a user threshold rule) or a store that holds dcgm-exporter families makes the round
read every GPU whole (``store_round``): ``whole_reads_needed``.
"""

from __future__ import annotations

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
from gpulens.alerts.checks import (
    ECC_UNCORRECTED,
    HW_POWER_BRAKE_BIT,
    HW_SLOWDOWN,
    NVLINK_ERROR_COUNTERS,
    PCIE_REPLAYS,
    SW_POWER_CAP,
    THERMAL_BITS,
    counters_unchanged,
)
from gpulens.alerts.engine import AlertEngine
from gpulens.alerts.fabriccatalogue import FABRIC_RULES
from gpulens.alerts.history import History
from gpulens.alerts.state import FIRING, PENDING, AlertState
from gpulens.alerts.storeround import assemble_round, store_round
from gpulens.hardware import pcie_max_bytes_per_second
from gpulens.model import GpuReading
from gpulens.rounds import RoundResult
from gpulens.storage.prometheus import PromReader
from gpulens.storage.prometheus import families as fam
from gpulens.storage.prometheus.alertread import GpuFacts, round_readings, uuids_where
from gpulens.storage.prometheus.families import field_selector

# Thresholds are loosened by this share so that a float rounded differently in Prometheus never hides a GPU.
SLACK: Final = 1 - 1e-6
# Rules that read nothing beyond the round fields (or nothing from Prometheus: the fabric's)
ROUND_FIELD_RULES: Final = frozenset(
    {IDLE_ALLOCATED, GPU_LOST, EXPORTER_DOWN, COMMUNICATION_STALL, JOB_STRAGGLER, JOB_INEFFICIENT, WATCHDOG}
    | {rule.name for rule in FABRIC_RULES}
)


def _filter(rule: AlertRule) -> str | None:
    """PromQL naming every GPU ``rule`` could fire on (a superset of its condition) for the part of its condition
    that neither the round fields (``_named_here``) nor the engine's history (``counters_changed``) tell; None for a
    rule that needs no more than those."""
    name = rule.check or rule.name
    sel = field_selector
    if name == ECC_UNCORRECTABLE:
        return f"{sel('remapped_rows_failure')} != 0"
    if name == PCIE_DEGRADED:
        # a link below its maximum: its current and maximum width (or generation) differ (one aggregation, no
        # join). A generation below its maximum counts only while the GPU is busy; the filter names it busy or not
        # (the GPU is then read whole and judged): the busy test's ceiling join cost Prometheus more than the rest
        families = (sel(f).partition("{")[0] for f in ("pcie_link_width", "pcie_link_generation"))
        return " or ".join(f"stddev by (uuid) ({family}) > 0" for family in families)
    return None


# The counters each error rule compares across its window (XidError's: ``_xids_grew``)
_COUNTERS: Final[dict[str, Callable[[GpuReading], object]]] = {
    PCIE_DEGRADED: PCIE_REPLAYS,
    NVLINK_ERRORS: NVLINK_ERROR_COUNTERS,
    ECC_UNCORRECTABLE: ECC_UNCORRECTED,
}


def _xids_grew(history: History, since: float, reading: GpuReading) -> bool:
    """Whether an XID count of ``reading`` is above its count in the GPU's oldest reading since ``since`` (as
    ``checks.xid_error`` compares them; any code: a superset)."""
    if not reading.xid_errors:
        return False
    oldest = history.reading_since(reading.uuid, since)
    if oldest is None:
        return False
    before = oldest[1].xid_errors if oldest[1].up else {}
    return any(count > before.get(code, 0) for code, count in reading.xid_errors.items())


def counters_changed(
    rules: Iterable[AlertRule], history: History, now: float, readings: Sequence[GpuReading]
) -> set[str]:
    """The GPUs of ``readings`` (a round about to join ``history`` at ``now``) whose counters that an error rule
    among ``rules`` compares across its window changed since the window's first reading, as the rule itself will
    test them (``checks.counters_unchanged``): the only GPUs it can fire on. The counters are round fields, so the
    engine's own history answers, with no PromQL ``changes()`` visiting every counter's samples again."""
    out: set[str] = set()
    for rule in rules:
        name = rule.check or rule.name
        if name not in _COUNTERS and name != XID_ERROR:
            continue
        since = now - rule.threshold("window_s")
        if name == XID_ERROR:
            out |= {r.uuid for r in readings if _xids_grew(history, since, r)}
            continue
        start, counters = history.round_since(since), _COUNTERS[name]
        if start is None:
            continue  # no earlier round in the window: nothing to compare with
        first = start.gpus
        for reading in readings:
            before = first.get(reading.uuid)
            if before is not None:
                if counters(before) != counters(reading):
                    out.add(reading.uuid)
            elif not counters_unchanged(history, start, reading, since, counters):
                out.add(reading.uuid)
    return out


def _busier(reading: GpuReading, link: str) -> float | None:
    """The busier direction's rate of ``link`` (pcie, nvlink), None where neither is read."""
    rates = [
        r
        for r in (getattr(reading, f"{link}_tx_bytes_per_second"), getattr(reading, f"{link}_rx_bytes_per_second"))
        if r is not None
    ]
    return max(rates) if rates else None


def _named_here(rule: AlertRule, reading: GpuReading, facts: GpuReading | None) -> bool:
    """Whether ``rule`` could fire on the GPU of this round-field reading, for the part of its condition that the
    round fields tell, against the GPU's constants (``facts``; a constant Prometheus does not hold fails the rule's
    own test too): no PromQL needed."""
    name = rule.check or rule.name
    bits = reading.throttle_reasons or 0
    if name == THERMAL_THROTTLING:
        temp, slowdown = reading.temperature_celsius, facts.slowdown_temperature_celsius if facts else None
        margin = rule.threshold("margin_celsius") + 0.001
        hot = temp is not None and slowdown is not None and temp >= slowdown - margin
        return hot or bool(bits & (THERMAL_BITS | HW_SLOWDOWN))
    if name == HW_POWER_BRAKE:
        return bool(bits & HW_POWER_BRAKE_BIT)
    if name == POWER_CAPPED:
        # sw_power_cap set: the rule then weighs power against the limit, which only a whole read holds (a GPU at
        # its cap is at its limit: the set the alert fires on, whose GPUs are read whole anyway, as it is pending)
        return bool(bits & SW_POWER_CAP)
    if name == MEMORY_SATURATED:
        used, total = reading.memory_used_bytes, facts.memory_total_bytes if facts else None
        return used is not None and bool(total) and used >= rule.threshold("used_ratio") * SLACK * (total or 0)
    if name == PCIE_SATURATED:
        rate = _busier(reading, "pcie")
        ceiling = (
            pcie_max_bytes_per_second(facts.pcie_link_generation_max, facts.pcie_link_width_max) if facts else None
        )
        return (
            rate is not None and bool(ceiling) and rate >= rule.threshold("utilization_ratio") * SLACK * (ceiling or 0)
        )
    if name == NVLINK_SATURATED:
        rate, links = _busier(reading, "nvlink"), reading.nvlink_links_active
        share = rule.threshold("utilization_ratio") * rule.threshold("link_bytes_per_second") * SLACK
        return rate is not None and bool(links) and rate >= (links or 0) * share
    return False


# The rules ``_named_here`` tells something of
_HERE: Final = frozenset(
    {THERMAL_THROTTLING, HW_POWER_BRAKE, POWER_CAPPED, MEMORY_SATURATED, PCIE_SATURATED, NVLINK_SATURATED}
)


def named_here(rules: Sequence[AlertRule], readings: Iterable[GpuReading], facts: Mapping[str, GpuReading]) -> set[str]:
    """The GPUs whose round fields say a rule could fire on them (``_named_here``; ``facts``: each GPU's
    constants, ``GpuFacts.of``)."""
    judged = [r for r in rules if (r.check or r.name) in _HERE]
    return {g.uuid for g in readings if any(_named_here(r, g, facts.get(g.uuid)) for r in judged)}


def gpu_filters(rules: Iterable[AlertRule]) -> list[str]:
    """Each rule's filter (see ``_filter``)."""
    return [f for rule in rules if (f := _filter(rule)) is not None]


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
    history: History,
    facts: GpuFacts,
    watched: Iterable[str] = (),
) -> RoundResult:
    """The cluster now, as one round (see the module's docstring); ``history``: the engine's, which this round is
    about to join; ``facts``: the GPUs' constants, as the rounds before left them."""
    readings, named, jobs, targets = store.parallel(
        lambda: round_readings(store, max_age_s=max_age_s),
        lambda: uuids_where(store, gpu_filters(rules)),
        store.current_jobs,
        store.target_health,
    )
    constants = facts.of([r.uuid for r in readings])
    changed = counters_changed(rules, history, now, readings)
    detail = sorted(named | changed | named_here(rules, readings, constants) | set(watched))
    if detail:
        whole = {r.uuid: r for r in store.latest_readings(uuids=detail, max_age_s=max_age_s)}
        readings = [whole.get(r.uuid, r) for r in readings]
    return assemble_round(store.backend, now, readings, jobs, [], targets)


def round_reader(
    store: PromReader, rules: Sequence[AlertRule], engine: Callable[[], AlertEngine | None]
) -> Callable[[float, float], RoundResult]:
    """``read(now, max_age_s)`` for ``storeround.run_store_rules``: ``prom_round`` with the engine's history and
    the GPUs of its alerts (``engine()``, as it is at each round), or ``store_round`` where whole reads are needed
    or the engine has judged no round yet (``engine()`` is None: a process that has just become active must see
    each GPU its stored alerts name)."""
    facts = GpuFacts(store)

    def read(now: float, max_age_s: float) -> RoundResult:
        judging = engine()
        if judging is None or whole_reads_needed(store, rules):
            return store_round(store, now, max_age_s=max_age_s)
        watched = watched_gpus(judging.states)
        return prom_round(
            store, now, max_age_s=max_age_s, rules=rules, history=judging.history, facts=facts, watched=watched
        )

    return read
