"""Rule rounds over Prometheus that read whole only the GPUs a rule could fire on.

``prom_round`` builds the same ``RoundResult`` as ``storeround.store_round`` with the same alerts, reading less. What
it reads for each rule is the rule's catalogue entry's ``RoundPlan`` (``alerts.definition``):

* every GPU's *round fields* (the union of the rules' ``fields``: what the job detectors summarise, the counters the
  error rules compare across their window, what tells whether a threshold rule could fire), its set slowdown reasons
  and XID counts, so that the history, the job summaries, the stall and straggler detectors, ``GpuIdleAllocated``
  and ``GpuLost`` see exactly what a whole read gives them;
* the other fields only for the GPUs that a rule could fire on, read whole:
  - those that the rules' PromQL filters name (``gpu_filters``, a query each, at once);
  - those whose round fields say so against the GPU's constants (``named_here``, ``alertread.GpuFacts``: in
    PromQL the joins cost Prometheus more than the reads);
  - those whose error counters changed within a rule's window, as the engine's history tells
    (``counters_changed``);
  - the GPUs of the engine's pending and firing alerts of those rules.

A rule the catalogue does not know (a user threshold rule) or a store that holds dcgm-exporter families makes the
round read every GPU whole (``store_round``): ``whole_reads_needed``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

from gpulens.alerts.base import AlertRule
from gpulens.alerts.catalogue import DEFINITIONS, definition
from gpulens.alerts.checks import counters_unchanged
from gpulens.alerts.definition import RoundPlan
from gpulens.alerts.engine import AlertEngine
from gpulens.alerts.history import History
from gpulens.alerts.state import FIRING, PENDING, AlertState
from gpulens.alerts.storeround import assemble_round, fabric_reads, round_reads, store_round
from gpulens.model import GpuReading
from gpulens.rounds import RoundResult
from gpulens.storage.prometheus import PromReader
from gpulens.storage.prometheus import families as fam
from gpulens.storage.prometheus.alertread import GpuFacts, round_readings, uuids_where


def _plans(rules: Iterable[AlertRule]) -> list[tuple[AlertRule, RoundPlan]]:
    return [(rule, entry.round) for rule in rules if (entry := definition(rule)) is not None]


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
    for rule, plan in _plans(rules):
        if plan.counters is None and not plan.xids:
            continue
        since = now - rule.threshold("window_s")
        if plan.xids:
            out |= {r.uuid for r in readings if _xids_grew(history, since, r)}
        if plan.counters is None:
            continue
        start, counters = history.round_since(since), plan.counters
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


def named_here(rules: Sequence[AlertRule], readings: Iterable[GpuReading], facts: Mapping[str, GpuReading]) -> set[str]:
    """The GPUs whose round fields say a rule could fire on them (each plan's ``here``; ``facts``: each GPU's
    constants, ``GpuFacts.of``)."""
    judged = [(rule, plan.here) for rule, plan in _plans(rules) if plan.here is not None]
    return {g.uuid for g in readings if any(here(rule, g, facts.get(g.uuid)) for rule, here in judged)}


def gpu_filters(rules: Iterable[AlertRule]) -> list[str]:
    """Each rule's PromQL filter (its plan's ``promql``)."""
    return [plan.promql(rule) for rule, plan in _plans(rules) if plan.promql is not None]


def whole_reads_needed(store: PromReader, rules: Iterable[AlertRule]) -> bool:
    """Whether a round must read every GPU whole: a rule the catalogue does not know, or dcgm-exporter families in
    the store (the filters are written over gpulens families)."""
    names = store.present_names()
    if names is None or names & set(fam.DCGM_PRESENCE):
        return True
    return any(definition(rule) is None for rule in rules)


def watched_gpus(states: Mapping[str, AlertState]) -> set[str]:
    """The GPUs of pending and firing alerts of the rules that read more than the round fields: read whole every
    round, so that each is judged as a whole read would judge it (the others are, from the round fields)."""
    return {
        uuid
        for s in states.values()
        if s.state in (PENDING, FIRING) and _reads_whole(s.rule) and (uuid := s.labels.get("uuid"))
    }


# Whether a builtin reads more of a GPU than the round fields (a user rule always does)
_WHOLE: Final = {d.rule.name: d.round.whole for d in DEFINITIONS}


def _reads_whole(name: str) -> bool:
    return _WHOLE.get(name, True)


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
    reads = round_reads(rules)
    readings, named, jobs, targets, fabric = store.parallel(
        lambda: round_readings(store, max_age_s=max_age_s, fields=reads.fields, reasons=reads.reasons, xids=reads.xids),
        lambda: uuids_where(store, gpu_filters(rules)),
        store.current_jobs,
        store.target_health,
        lambda: fabric_reads(store, max_age_s=max_age_s, reads=reads),
    )
    constants = facts.of([r.uuid for r in readings])
    changed = counters_changed(rules, history, now, readings)
    detail = sorted(named | changed | named_here(rules, readings, constants) | set(watched))
    if detail:
        whole = {r.uuid: r for r in store.latest_readings(uuids=detail, max_age_s=max_age_s)}
        readings = [whole.get(r.uuid, r) for r in readings]
    return assemble_round(store.backend, now, readings, jobs, [], targets, fabric)


def round_reader(
    store: PromReader, rules: Sequence[AlertRule], engine: Callable[[], AlertEngine | None]
) -> Callable[[float, float], RoundResult]:
    """``read(now, max_age_s)`` for ``storeround.run_store_rules``: ``prom_round`` with the engine's history and
    the GPUs of its alerts (``engine()``, as it is at each round), or ``store_round`` where whole reads are needed
    or the engine has judged no round yet (``engine()`` is None: a process that has just become active must see
    each GPU its stored alerts name)."""
    reads = round_reads(rules)
    facts = GpuFacts(store, reads.facts)

    def read(now: float, max_age_s: float) -> RoundResult:
        judging = engine()
        if judging is None or whole_reads_needed(store, rules):
            return store_round(store, now, max_age_s=max_age_s, reads=reads)
        watched = watched_gpus(judging.states)
        return prom_round(
            store, now, max_age_s=max_age_s, rules=rules, history=judging.history, facts=facts, watched=watched
        )

    return read
