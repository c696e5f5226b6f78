"""The state machine: for, keep_firing_for, inhibition, silences, holds; fingerprints; silences and matchers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from hashlib import sha256

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulens.alerts.base import AlertRule, Candidate
from gpulens.alerts.matchers import Matcher, MatcherError, matchers_from_json, parse_matcher
from gpulens.alerts.state import (
    FIRING,
    INACTIVE,
    PENDING,
    RESOLVED,
    AlertState,
    Silence,
    StepResult,
    fingerprint,
    silencer,
    step,
)

RULES = {
    "Hot": AlertRule("Hot", "warning", for_s=30.0, keep_firing_for_s=0.0),
    "Flappy": AlertRule("Flappy", "warning", for_s=0.0, keep_firing_for_s=25.0),
    "Now": AlertRule("Now", "critical", for_s=0.0),
    "ExporterDown": AlertRule("ExporterDown", "critical", for_s=0.0, scope="node"),
    "GpuLost": AlertRule("GpuLost", "critical", for_s=0.0),
    "Straggle": AlertRule("Straggle", "warning", for_s=30.0, scope="job"),
}


def cand(rule: str, value: float = 1.0, hold: bool = False, **labels: str) -> Candidate:
    full = {"alertname": rule, "severity": RULES[rule].severity, **labels} if not hold else labels
    return Candidate(rule, full, value, f"{rule} on {labels}", "why", hold=hold)


class Machine:
    """Runs ``step`` round after round, 10 s apart."""

    def __init__(self, **kwargs: object) -> None:
        self.states: dict[str, AlertState] = {}
        self.now = 0.0
        self.kwargs = kwargs
        self.results: list[StepResult] = []

    def run(self, candidates: Sequence[Candidate], **kwargs: object) -> StepResult:
        self.now += 10.0
        result = step(self.states, candidates, RULES, self.now, **{**self.kwargs, **kwargs})  # type: ignore[arg-type]
        self.states = result.states
        self.results.append(result)
        return result

    def only(self) -> AlertState:
        [state] = self.states.values()
        return state


def kinds(result: StepResult) -> list[str]:
    return [t.state for t in result.transitions]


def test_pending_then_firing_after_for_then_resolved() -> None:
    m = Machine()
    hot = cand("Hot", node="n1", gpu="0")
    assert kinds(m.run([hot])) == [PENDING]
    assert m.only().state == PENDING
    assert m.run([hot]).transitions == []
    assert m.run([hot]).transitions == []
    fired = m.run([hot])  # 30 s after it began
    assert kinds(fired) == [FIRING]
    assert fired.notifications[0].state == FIRING
    state = m.only()
    assert (state.state, state.active_since, state.fired_at) == (FIRING, 10.0, 40.0)
    resolved = m.run([])
    assert kinds(resolved) == [RESOLVED]
    assert m.only().resolved_at == 50.0


def test_pending_that_clears_goes_inactive_without_notification() -> None:
    m = Machine()
    m.run([cand("Hot", node="n1")])
    result = m.run([])
    assert kinds(result) == [INACTIVE]
    assert result.notifications == []
    assert result.states == {}
    assert result.removed == [fingerprint({"alertname": "Hot", "severity": "warning", "node": "n1"})]


def test_for_zero_fires_at_once() -> None:
    m = Machine()
    assert kinds(m.run([cand("Now", node="n1")])) == [FIRING]


def test_keep_firing_for_bridges_short_gaps() -> None:
    m = Machine()
    flappy = cand("Flappy", node="n1")
    m.run([flappy])
    assert m.run([]).transitions == []  # 10 s without: still firing
    assert m.run([]).transitions == []  # 20 s
    assert m.only().state == FIRING
    m.run([flappy])  # back: the gap never showed
    m.run([])
    m.run([])
    assert kinds(m.run([])) == [RESOLVED]  # 30 s >= 25 s


def test_resolved_alert_that_returns_starts_again() -> None:
    m = Machine()
    now = cand("Now", node="n1")
    m.run([now])
    m.run([])
    again = m.run([now])
    assert kinds(again) == [FIRING]
    assert m.only().active_since == 30.0


def test_resolved_alerts_are_kept_for_a_while_then_removed() -> None:
    m = Machine(resolved_retention_s=25.0)
    m.run([cand("Now", node="n1")])
    m.run([])
    assert m.only().state == RESOLVED
    m.run([])
    m.run([])
    result = m.run([])
    assert result.states == {}
    assert len(result.removed) == 1


def test_values_and_summaries_follow_the_latest_round() -> None:
    m = Machine()
    m.run([cand("Now", 1.0, node="n1")])
    m.run([cand("Now", 7.0, node="n1")])
    assert m.only().value == 7.0


def test_held_alerts_keep_their_state() -> None:
    m = Machine()
    hot = cand("Hot", node="n1")
    m.run([hot])
    m.run([hot])
    held = m.run([], held=lambda rule, labels: labels.get("node") == "n1")
    assert held.transitions == []
    assert m.only().state == PENDING
    assert kinds(m.run([hot])) == [FIRING]  # the held round counted towards `for`


def test_hold_candidates_keep_matching_alerts_only() -> None:
    m = Machine()
    m.run([cand("Straggle", job_id="a", gpu="1"), cand("Straggle", job_id="b", gpu="2")])
    result = m.run([cand("Straggle", hold=True, job_id="a")])
    assert [t.labels["job_id"] for t in result.transitions] == ["b"]  # b went inactive, a is held
    assert [s.labels["job_id"] for s in m.states.values()] == ["a"]


def test_a_hold_does_not_start_an_alert() -> None:
    m = Machine()
    assert m.run([cand("Straggle", hold=True, job_id="a")]).states == {}


def test_exporter_down_mutes_the_nodes_other_alerts() -> None:
    m = Machine()
    m.run([cand("Now", node="n1", gpu="0"), cand("Now", node="n2", gpu="0")])
    result = m.run([cand("Now", node="n1", gpu="0"), cand("Now", node="n2", gpu="0"), cand("ExporterDown", node="n1")])
    muted = {s.labels["node"]: s.muted for s in result.states.values() if s.rule == "Now"}
    assert muted == {"n1": "inhibited", "n2": None}
    assert [t.rule for t in result.notifications] == ["ExporterDown"]
    # while inhibited, a resolution is not notified either
    resolved = m.run([cand("Now", node="n2", gpu="0"), cand("ExporterDown", node="n1")])
    assert [(t.state, t.muted) for t in resolved.transitions] == [(RESOLVED, True)]
    assert resolved.notifications == []


def test_gpu_lost_mutes_that_gpus_alerts_only() -> None:
    m = Machine()
    alerts = [cand("Now", node="n1", gpu="0", uuid="U0"), cand("Now", node="n1", gpu="1", uuid="U1")]
    result = m.run([*alerts, cand("GpuLost", node="n1", gpu="0", uuid="U0")])
    muted = {s.labels["uuid"]: s.muted for s in result.states.values() if s.rule == "Now"}
    assert muted == {"U0": "inhibited", "U1": None}
    lost = next(s for s in result.states.values() if s.rule == "GpuLost")
    assert lost.muted is None  # a source does not inhibit itself


def test_silenced_alerts_keep_their_state_without_notifications() -> None:
    silence = Silence("1", (Matcher("node", "=", "n1"),), starts_at=0.0, ends_at=45.0, comment="maintenance")
    m = Machine()
    hot = cand("Hot", node="n1")
    for _ in range(4):
        result = m.run([hot], silenced=silencer([silence], m.now + 10.0))
    assert m.only().state == FIRING
    assert m.only().muted == "silenced"
    assert kinds(result) == [FIRING]
    assert result.notifications == []
    after = m.run([hot], silenced=silencer([silence], m.now + 10.0))  # t=50: the silence ended at 45
    assert m.only().muted is None
    assert after.transitions == []  # still firing; grouping notices it is no longer muted


def test_candidates_of_unknown_rules_are_ignored_and_removed_rules_resolve() -> None:
    m = Machine()
    m.run([cand("Now", node="n1")])
    result = step(m.states, [Candidate("Gone", {"alertname": "Gone"}, None, "", "")], {}, 20.0)
    assert [s.state for s in result.states.values()] == [RESOLVED]


def test_annotations_carry_summary_description_and_dashboard_link() -> None:
    m = Machine(dashboard_url="https://gpulens.example/")
    m.run([cand("Now", node="n1", uuid="GPU-1"), cand("Straggle", job_id="j 1")])
    by_rule = {s.rule: s for s in m.states.values()}
    assert by_rule["Now"].annotations["dashboard"] == "https://gpulens.example/gpus/GPU-1"
    assert by_rule["Now"].annotations["summary"].startswith("Now on")
    assert by_rule["Now"].annotations["description"] == "why"
    assert by_rule["Straggle"].annotations["dashboard"] == "https://gpulens.example/jobs/j%201"


def test_state_round_trips_through_json() -> None:
    m = Machine()
    m.run([cand("Now", node="n1")])
    state = m.only()
    assert AlertState.from_json(state.to_json()) == state
    with pytest.raises(ValueError, match="not an alert state"):
        AlertState.from_json({"labels": {}})


# ------------------------------------------------------------------------------------------------ fingerprints

label_sets = st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=6)


@given(label_sets)
def test_fingerprint_ignores_order(labels: Mapping[str, str]) -> None:
    reordered = dict(reversed(list(labels.items())))
    assert fingerprint(labels) == fingerprint(reordered)
    assert len(fingerprint(labels)) == 16
    assert int(fingerprint(labels), 16) >= 0


def test_fingerprint_is_stable_across_releases_and_separates_values() -> None:
    encoded = b"alertname\x00GpuLost\x01gpu\x003\x01node\x00node-01\x01"  # sorted keys, NUL and SOH separators
    assert fingerprint({"node": "node-01", "alertname": "GpuLost", "gpu": "3"}) == sha256(encoded).hexdigest()[:16]
    assert fingerprint({"a": "bc"}) != fingerprint({"ab": "c"})
    assert fingerprint({"a": "b", "c": ""}) != fingerprint({"a": "b"})


# ------------------------------------------------------------------------------------------------ silences


def test_silence_matching_and_activity() -> None:
    silence = Silence(
        "7", (parse_matcher("node=~node-0[1-3]"), parse_matcher("severity!=critical")), 100.0, 200.0, "c", "me"
    )
    assert silence.matches({"node": "node-02", "severity": "warning"})
    assert not silence.matches({"node": "node-02", "severity": "critical"})
    assert not silence.matches({"node": "node-10", "severity": "warning"})  # anchored
    assert silence.active(100.0)
    assert not silence.active(200.0)
    assert Silence.from_json(silence.to_json()) == silence
    assert not Silence("8", (), 0.0, 1.0).matches({"node": "x"})  # no matchers silence nothing


@pytest.mark.parametrize(
    ("text", "name", "op", "value"),
    [
        ("node=node-01", "node", "=", "node-01"),
        ("node!=node-01", "node", "!=", "node-01"),
        ("job_id=~dev-.*", "job_id", "=~", "dev-.*"),
        ("job_id!~'dev-.*'", "job_id", "!~", "dev-.*"),
        (" severity = critical ", "severity", "=", "critical"),
    ],
)
def test_parse_matcher(text: str, name: str, op: str, value: str) -> None:
    m = parse_matcher(text)
    assert (m.name, m.op, m.value) == (name, op, value)
    assert matchers_from_json([m.to_json()]) == (m,)


@pytest.mark.parametrize("text", ["node", "=x", "no de=x", "node=~(", "node!x"])
def test_bad_matchers(text: str) -> None:
    with pytest.raises(MatcherError):
        parse_matcher(text)


def test_missing_label_matches_empty_value() -> None:
    assert parse_matcher("job_id=").matches({"node": "n"})
    assert parse_matcher("job_id!~.+").matches({"node": "n"})
    assert matchers_from_json({"node": "n"}) == (Matcher("node", "=", "n"),)


def test_an_alert_keeps_when_its_fault_began_apart_from_when_it_fired() -> None:
    """A detector that knows the fault began before this round (a hang's first stalled round) gives ``began``; the
    alert keeps it across rounds and through its JSON, and a rule that says nothing begins when it first held."""
    from gpulens.alerts.base import AlertRule, Candidate
    from gpulens.alerts.state import AlertState, step

    rules = {"Stall": AlertRule("Stall", "critical", for_s=30.0), "Hot": AlertRule("Hot", "warning", for_s=30.0)}
    stall = Candidate("Stall", {"alertname": "Stall", "job_id": "j"}, 1.0, "s", "d", began=70.0)
    hot = Candidate("Hot", {"alertname": "Hot", "uuid": "u"}, 1.0, "s", "d")
    first = step({}, [stall, hot], rules, 100.0)
    fired = step(first.states, [stall, hot], rules, 130.0)
    by_rule = {s.rule: s for s in fired.states.values()}
    assert by_rule["Stall"].state == "firing"
    assert (by_rule["Stall"].began, by_rule["Stall"].active_since, by_rule["Stall"].fired_at) == (70.0, 100.0, 130.0)
    assert by_rule["Hot"].began == 100.0  # the first round past its threshold
    assert AlertState.from_json(by_rule["Stall"].to_json()).began == 70.0
