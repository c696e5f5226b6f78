"""One rule, three ways: what the rule parity test (``test_rule_parity.py``) runs and compares.

A builtin rule runs (1) in the alert engine over SQL (``gpulens simulate``: ``simulate()`` over a temporary SQLite
store, one round per scenario step), (2) in the same engine over Prometheus (``round_reader`` with an injected clock,
one round every ``ROUND_S``, as ``gpulens alerts run --db prometheus+http://...`` reads), and (3) in Prometheus itself,
evaluating ``gpulens rules export --format prometheus``: each exported alerting rule's ``expr`` is asked with
``query_range`` at the evaluation interval over the scenario (Prometheus evaluates an expression at those instants
exactly as its rule manager does), and ``prometheus_alerts`` applies its alert state machine.

**Identity.** An alert is its rule's name and the labels that say what it is about, by the rule's scope:

- a GPU rule: the GPU's ``uuid`` (and ``xid`` for ``XidError``, one alert per code); an exported expression may give
  a GPU several series (one per branch of an ``or`` whose labels differ), which are the same alert here;
- a job rule: ``job_id`` (and ``signature`` for ``CommunicationStall``, ``uuid`` for ``JobStraggler``, which names
  the slow GPU); the engine's ``nodes`` and ``user`` are descriptions of the job, not part of what it is;
- a port rule (``IbLinkDown`` ... ``FabricBandwidthSaturated``): ``node``, ``device`` and ``port``;
- ``ExporterDown``: the node (the engine over SQL names it, Prometheus's ``instance`` is ``<node>:<port>``).

``Watchdog`` fires always and everywhere; it is left out, as ``gpulens simulate`` leaves it out.

**Onset.** When an alert first begins firing: the step of the SQL engine, the round of the Prometheus engine, the
evaluation of the Prometheus rule. Two ways agree when they raise the same alerts and each alert's first onset lies
within ``TOLERANCE_S`` (two evaluation intervals) of the other's. An alert that begins firing within
``TOLERANCE_S`` of the scenario's end in one way only is no difference: the other may not have had the rounds left.
"""

from __future__ import annotations

import calendar
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from gpulens.alerts.base import AlertRule
from gpulens.alerts.catalogue import (
    COMMUNICATION_STALL,
    EXPORTER_DOWN,
    FABRIC_CONGESTION,
    FABRIC_SATURATED,
    IB_ERRORS,
    IB_LINK_DEGRADED,
    IB_LINK_DOWN,
    IB_LINK_FLAPPING,
    JOB_STRAGGLER,
    WATCHDOG,
    XID_ERROR,
)
from gpulens.alerts.engine import AlertEngine
from gpulens.alerts.promround import round_reader
from gpulens.alerts.state import FIRING
from gpulens.config import parse_duration
from gpulens.settings import StoreAuth
from gpulens.storage.prometheus import PromReader
from gpulens.storage.prometheus.client import PromClient

EXAMPLES: Final = Path(__file__).parents[2] / "examples" / "scenarios"
SCENARIOS: Final = ("faults", "hangs", "fabric", "confounders")
STEP_S: Final = 10.0  # the scrape interval the history is written at (each scenario's own step)
ROUND_S: Final = 60.0  # the Prometheus engine's interval and the exported rules' evaluation interval
TOLERANCE_S: Final = 2 * ROUND_S
# Each scenario's history starts this long after the previous one's: the scenarios share node names, and the longest
# window an exported rule looks back over (a port's highest rate, ``[1d]``) must not reach the scenario before.
SPACING_S: Final = 2 * 86400.0
MAX_AGE_S: Final = max(3 * ROUND_S, 30.0)  # what `gpulens alerts run` reads as current (run_store_rules)
PORT_RULES: Final = frozenset(
    {IB_LINK_DOWN, IB_LINK_FLAPPING, IB_LINK_DEGRADED, IB_ERRORS, FABRIC_CONGESTION, FABRIC_SATURATED}
)
WAYS: Final = ("sql", "engine", "promql")
# Families no rule reads in any way, left out of the history (a sixth of its samples): each NVLink link's state (the
# dashboard's link outages read it; the rules read the count of active links).
UNREAD: Final = ("gpulens_gpu_nvlink_link_active",)

Identity = tuple[str, ...]  # (rule, identifying label values ...)
Onsets = dict[Identity, float]  # identity -> first onset, in seconds since the scenario's start


def identity(rule: str, labels: Mapping[str, str], scope: str) -> Identity:
    """The alert ``rule`` with ``labels`` as the parity test tells alerts apart (the module docstring)."""
    if rule in PORT_RULES:
        return (rule, labels.get("node", ""), labels.get("device", ""), labels.get("port", ""))
    if rule == EXPORTER_DOWN:
        node = labels.get("node") or labels.get("instance") or labels.get("target", "")
        return (rule, node.rpartition("/")[2].partition(":")[0])
    if rule == COMMUNICATION_STALL:
        return (rule, labels.get("job_id", ""), labels.get("signature", ""))
    if rule == JOB_STRAGGLER:
        return (rule, labels.get("job_id", ""), labels.get("uuid", ""))
    if scope == "job":
        return (rule, labels.get("job_id", ""))
    if rule == XID_ERROR:
        return (rule, labels.get("uuid", ""), labels.get("xid", ""))
    return (rule, labels.get("uuid", ""))


def _first(onsets: Onsets, key: Identity, at: float) -> None:
    if key not in onsets or at < onsets[key]:
        onsets[key] = at


# hangs.toml's hangs leave every rank's collective count equal (the data is stuck in the network): the parity test
# gives its spinning hang two ranks that never launch the collective, so that NCCL RAS shows the mismatch the
# ``rank_missing`` signature names (``stuck_ranks``, docs/scenarios.md).
_STUCK: Final = ('job = "spin"\nat = "15m"\n', 'job = "spin"\nat = "15m"\nstuck_ranks = ["node-00:0-1"]\n')


def scenario_text(name: str) -> str:
    """The scenario the parity test runs: the example's TOML (hangs.toml with ``_STUCK``)."""
    text = (EXAMPLES / f"{name}.toml").read_text()
    if name == "hangs":
        assert _STUCK[0] in text, "hangs.toml's spinning hang moved: update _STUCK"
        text = text.replace(*_STUCK)
    return text


# --- way 1: the engine over SQL -------------------------------------------------------------------------------------


def sql_onsets(name: str) -> Onsets:
    """``simulate()`` of the scenario (``scenario_text``) over a temporary SQLite store: each alert's first onset
    (``startsAt``)."""
    from gpulens.alerts.rules import builtin_rules
    from gpulens.cli.simulation import simulate
    from gpulens.exporter.sim import load_scenario

    with tempfile.TemporaryDirectory(prefix="gpulens-parity-") as tmp:
        path = Path(tmp) / f"{name}.toml"
        path.write_text(scenario_text(name))
        start = load_scenario(path).start
        alerts = simulate(path).alerts
    scopes = {rule.name: rule.scope for rule in builtin_rules()}
    out: Onsets = {}
    for alert in alerts:
        rule = str(alert["alertname"])
        labels = alert["labels"]
        assert isinstance(labels, dict)
        at = calendar.timegm(time.strptime(str(alert["startsAt"]), "%Y-%m-%dT%H:%M:%SZ")) - start
        _first(out, identity(rule, labels, scopes.get(rule, "gpu")), at)
    return out


# --- way 2: the engine over Prometheus --------------------------------------------------------------------------------


class Clock:
    """The Prometheus reader's clock, set to each round's time."""

    def __init__(self) -> None:
        self.at = 0.0

    def now(self) -> float:
        return self.at

    def monotonic(self) -> float:
        return self.at


def engine_onsets(base: str, rules: Sequence[AlertRule], start: float, end: float, offset: float) -> Onsets:
    """The engine over the Prometheus at ``base``, one round every ``ROUND_S`` from ``start + offset`` (its first
    round whole, every later one filtered: as ``gpulens alerts run`` reads): each alert's first firing round."""
    clock = Clock()
    store = PromReader("prometheus+" + base, StoreAuth(min_step_s=STEP_S), clock=clock)
    engine = AlertEngine(rules)
    scopes = {rule.name: rule.scope for rule in rules}
    judged = False
    read = round_reader(store, rules, lambda: engine if judged else None)
    out: Onsets = {}
    k = 0
    try:
        while (t := start + k * ROUND_S) < end - 1e-9:
            clock.at = t + offset
            result = read(t + offset, MAX_AGE_S)
            engine.process(result.time, result.snapshots, result.targets)
            judged = True
            for s in engine.states.values():
                if s.state == FIRING and s.rule != WATCHDOG:
                    _first(out, identity(s.rule, dict(s.labels), scopes.get(s.rule, "gpu")), t - start)
            k += 1
    finally:
        store.close()
    return out


# --- way 3: Prometheus evaluating the exported rules ------------------------------------------------------------------


@dataclass
class PromAlert:
    """One alert of Prometheus's alert state machine (rules/alerting.go), by its label set."""

    active_at: float
    state: str = "pending"  # "pending" | "firing" | "inactive"
    fired_at: float | None = None
    keep_firing_since: float | None = None
    onsets: list[float] = field(default_factory=list)


def prometheus_alerts(
    present: Mapping[float, Iterable[frozenset[tuple[str, str]]]], for_s: float, keep_firing_for_s: float
) -> dict[frozenset[tuple[str, str]], list[float]]:
    """Prometheus's alert state machine over one rule's evaluations: ``present[t]`` holds the label sets the
    expression returned at evaluation ``t``; return each label set's firing onsets.

    At each evaluation, in time order: a label set returned with no active alert (or a resolved one) becomes a new
    alert, pending since this evaluation; one already pending or firing stays as it is (and stops keeping firing).
    An alert not returned is resolved at once when pending or, when firing, once ``keep_firing_for_s`` has passed
    since the first evaluation it was missing from (Prometheus resolves it at the first evaluation at or after that).
    Then a pending alert fires once ``for_s`` has passed since it became active (a ``for`` of 0 fires at once)."""
    active: dict[frozenset[tuple[str, str]], PromAlert] = {}
    out: dict[frozenset[tuple[str, str]], list[float]] = {}
    for t in sorted(present):
        returned = set(present[t])
        for labels in returned:
            alert = active.get(labels)
            if alert is None or alert.state == "inactive":
                active[labels] = PromAlert(active_at=t)
        for labels, alert in list(active.items()):
            if labels not in returned:
                keep = False
                if alert.state == "firing" and keep_firing_for_s > 0:
                    if alert.keep_firing_since is None:
                        alert.keep_firing_since = t
                    keep = t - alert.keep_firing_since < keep_firing_for_s
                if not keep:
                    if alert.state == "pending":
                        del active[labels]
                    alert.state = "inactive"
                    continue
            else:
                alert.keep_firing_since = None
            if alert.state == "pending" and t - alert.active_at >= for_s:
                alert.state, alert.fired_at = "firing", t
                out.setdefault(labels, []).append(t)
    return out


def exported_rules(document: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The alerting rules of an exported rules document's ``gpulens`` group (not gpulens's own health)."""
    return [r for g in document["groups"] if g["name"] == "gpulens" for r in g["rules"] if "alert" in r]


def promql_onsets(
    client: PromClient,
    rules: Sequence[Mapping[str, Any]],
    scopes: Mapping[str, str],
    start: float,
    end: float,
    offset: float,
) -> tuple[Onsets, list[str]]:
    """Each exported rule's expression asked over [start, end) every ``ROUND_S`` (``offset`` later), through
    ``prometheus_alerts``: each alert's first onset; and the rules Prometheus refused, with its error."""
    out: Onsets = {}
    errors = []
    last = start + ((end - start - 1e-9) // ROUND_S) * ROUND_S
    for rule in rules:
        name = rule["alert"]
        if name == WATCHDOG:
            continue
        try:
            series = client.query_range(rule["expr"], start + offset, last + offset, ROUND_S)
        except Exception as exc:  # noqa: BLE001 - a rule Prometheus cannot evaluate is a finding, not a crash
            errors.append(f"{name}: {exc}")
            continue
        present: dict[float, list[frozenset[tuple[str, str]]]] = {
            k * ROUND_S: [] for k in range(round((last - start) / ROUND_S) + 1)
        }
        for s in series:
            labels = {k: v for k, v in s.labels.items() if k != "__name__"} | dict(rule.get("labels", {}))
            key = frozenset(labels.items())
            for at, _ in s.samples:
                present[round(at - offset - start)].append(key)
        for_s = parse_duration(rule.get("for", "0s"))
        keep_s = parse_duration(rule.get("keep_firing_for", "0s"))
        for alert, onsets in prometheus_alerts(present, for_s, keep_s).items():
            _first(out, identity(name, dict(alert), scopes.get(name, "gpu")), min(onsets))
    return out, errors


# --- the comparison ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """An alert some ways raised and others did not (``missing``), or raised more than ``TOLERANCE_S`` apart."""

    key: Identity
    missing: tuple[str, ...]
    onsets: Mapping[str, float]

    def __str__(self) -> str:
        when = ", ".join(f"{way} {at / 60:.1f}m" for way, at in self.onsets.items())
        if self.missing:
            return f"{' '.join(self.key)}: not raised by {'/'.join(self.missing)} ({when})"
        return f"{' '.join(self.key)}: onsets apart ({when})"


def differences(ways: Mapping[str, Onsets], end: float, only: Mapping[str, frozenset[str]]) -> list[Difference]:
    """Every difference between the ways. ``only[way]``: the rules that way is compared on (the others it cannot
    say). An alert that begins within ``TOLERANCE_S`` of the scenario's ``end`` in the ways that raised it is no
    difference: the others had no rounds left to raise it."""
    out = []
    keys = sorted({key for onsets in ways.values() for key in onsets})
    for key in keys:
        compared = [way for way in ways if key[0] in only[way]]
        seen = {way: ways[way][key] for way in compared if key in ways[way]}
        missing = tuple(way for way in compared if way not in seen)
        if missing and all(at >= end - TOLERANCE_S for at in seen.values()):
            continue
        if missing or max(seen.values()) - min(seen.values()) > TOLERANCE_S:
            out.append(Difference(key, missing, seen))
    return out
