"""CommunicationStall and JobStraggler on hand-made histories: the signal, and every confounder of docs/domain.md §4."""

from __future__ import annotations

import functools
import statistics

from hypothesis import given
from hypothesis import strategies as st

from gpulens.alerts.catalogue import BUILTIN_RULES, COMMUNICATION_STALL, JOB_STRAGGLER
from gpulens.alerts.detect import _median_without, baseline
from gpulens.alerts.history import JobRound
from gpulens.alerts.rules import evaluate
from gpulens.alerts.state import step

from .support import GIB, Feed, blocked, job_snapshot, rule, snapshot, stalled, training, uuid

STALL = rule(COMMUNICATION_STALL)
STRAGGLER = rule(JOB_STRAGGLER)


def two_nodes(make, job: str = "train", **fields: object):
    """A 16-GPU job on two nodes, each GPU made by ``make(node, index, **fields)``."""
    made = functools.partial(make, **fields)
    return [job_snapshot("node-00", made, range(8), job), job_snapshot("node-01", made, range(8), job)]


def fed(baseline_rounds: int = 30) -> Feed:
    feed = Feed()
    feed.repeat(baseline_rounds, lambda _: two_nodes(training))
    return feed


# ------------------------------------------------------------------------------------------------ stall


def test_stall_of_a_communicating_job_is_a_candidate_with_a_readable_summary() -> None:
    feed = fed()
    for _ in range(6):
        feed.add(two_nodes(stalled))
    [c] = feed.candidates([STALL])
    assert c.labels["job_id"] == "train"
    assert c.labels["user"] == "alice"
    assert c.labels["alertname"] == COMMUNICATION_STALL
    assert c.labels["severity"] == "critical"
    assert c.labels["signature"] == "spinning"
    assert "gpu" not in c.labels  # the whole job, not one GPU
    assert c.labels["nodes"] == "node-00,node-01"  # where to look, on the alert itself
    assert c.summary == "job train: 16 GPUs at 100% with no NVLink traffic for 50s"
    assert c.value is not None
    assert c.value < 0.01


def test_no_stall_while_the_job_communicates() -> None:
    assert fed().candidates([STALL]) == []


def test_single_gpu_job_at_full_utilization_without_traffic_is_not_a_stall() -> None:
    feed = Feed()
    feed.repeat(40, lambda _: [job_snapshot("node-00", stalled, [0], "notebook")])
    assert feed.candidates([STALL]) == []


def test_data_loader_pause_on_every_rank_is_not_a_stall() -> None:
    feed = fed()
    feed.add(two_nodes(stalled, utilization_ratio=0.08))
    assert feed.candidates([STALL]) == []


def test_checkpoint_with_pcie_burst_is_not_a_stall() -> None:
    feed = fed()
    feed.add(two_nodes(stalled, utilization_ratio=0.04, pcie_tx_bytes_per_second=35e9))
    assert feed.candidates([STALL]) == []


def test_compute_phase_without_traffic_but_full_power_is_not_a_stall() -> None:
    """An evaluation phase: busy, no collectives, power stays up."""
    feed = fed()
    feed.repeat(10, lambda _: two_nodes(stalled, power_watts=590.0, sm_active_ratio=0.8))
    assert feed.candidates([STALL]) == []


def test_job_that_never_used_nvlink_or_pcie_has_no_baseline() -> None:
    """PCIe-only inference: the GPUs never communicated, so no traffic drop can be judged."""
    no_nvlink = dict(nvlink_tx_bytes_per_second=None, nvlink_rx_bytes_per_second=None, nvlink_links_active=0)
    quiet = functools.partial(training, pcie_tx_bytes_per_second=20e6, pcie_rx_bytes_per_second=20e6, **no_nvlink)
    feed = Feed()
    feed.repeat(30, lambda _: [job_snapshot("node-00", quiet, range(4), "serve")])
    spinning = functools.partial(stalled, **no_nvlink)
    feed.repeat(40, lambda _: [job_snapshot("node-00", spinning, range(4), "serve")])
    assert feed.candidates([STALL]) == []


def test_pcie_only_multi_node_job_that_stops_communicating_is_a_stall() -> None:
    pcie = dict(nvlink_tx_bytes_per_second=None, nvlink_rx_bytes_per_second=None, nvlink_links_active=0)
    feed = Feed()
    feed.repeat(30, lambda _: two_nodes(training, pcie_tx_bytes_per_second=8e9, **pcie))
    feed.add(two_nodes(stalled, **pcie))
    [c] = feed.candidates([STALL])
    assert "no PCIe traffic" in c.summary


def test_stall_with_dead_profiling_counters_is_found_through_power() -> None:
    dead = dict(sm_active_ratio=0.0, tensor_active_ratio=0.0)
    feed = Feed()
    feed.repeat(30, lambda _: two_nodes(training, **dead))
    feed.add(two_nodes(stalled, **dead))
    assert [c.labels["job_id"] for c in feed.candidates([STALL])] == ["train"]


def test_dead_profiling_counters_on_a_healthy_job_raise_nothing() -> None:
    feed = Feed()
    feed.repeat(40, lambda _: two_nodes(training, sm_active_ratio=0.0, tensor_active_ratio=0.0))
    assert feed.candidates([STALL, STRAGGLER]) == []


def test_without_power_a_live_sm_counter_corroborates_and_a_dead_one_does_not() -> None:
    feed = Feed()
    feed.repeat(30, lambda _: two_nodes(training, power_watts=None))
    feed.add(two_nodes(stalled, power_watts=None))
    assert len(feed.candidates([STALL])) == 1

    dead = Feed()
    dead.repeat(30, lambda _: two_nodes(training, power_watts=None, sm_active_ratio=0.0))
    dead.add(two_nodes(stalled, power_watts=None, sm_active_ratio=0.0))
    assert dead.candidates([STALL]) == []


def test_job_that_starts_stalled_has_no_baseline() -> None:
    feed = Feed()
    feed.repeat(3, lambda _: two_nodes(training))  # fewer rounds than baseline_rounds_min
    feed.repeat(20, lambda _: two_nodes(stalled))
    assert feed.candidates([STALL]) == []


def test_job_whose_gpus_leave_is_not_a_stall() -> None:
    """At its end a job's ranks exit one by one: the GPUs still listed go idle."""
    feed = fed()
    leaving = [
        job_snapshot("node-00", functools.partial(stalled, utilization_ratio=0.0, power_watts=70.0), range(8)),
        job_snapshot("node-01", stalled, range(8)),
    ]
    feed.add(leaving)
    assert feed.candidates([STALL]) == []


def test_one_rank_still_communicating_is_not_a_stall() -> None:
    feed = fed()
    feed.add([job_snapshot("node-00", stalled, range(8)), job_snapshot("node-01", training, range(8))])
    assert feed.candidates([STALL]) == []


def test_a_stall_longer_than_the_window_keeps_its_baseline() -> None:
    feed = Feed(window_s=300.0)
    feed.repeat(30, lambda _: two_nodes(training))
    feed.repeat(120, lambda _: two_nodes(stalled))  # 20 minutes, four windows
    assert len(feed.candidates([STALL])) == 1


def test_stall_rounds_do_not_enter_the_reference() -> None:
    feed = fed(10)
    feed.repeat(50, lambda _: two_nodes(stalled))
    reference = feed.history.job_reference("train")
    assert len(reference) == 10
    base = baseline(reference, 6)
    assert base is not None
    assert base.traffic > 50e9


def test_baseline_needs_enough_rounds() -> None:
    round_ = JobRound(0.0, 2, 0.9, 0.9, 0.9, 1e9, 1e9, 0.0, 500.0, 500.0, 0.5, 1.0, 68e9, 68e9)
    assert baseline([round_] * 5, 6) is None
    assert baseline([round_] * 6, 6) is not None


# ------------------------------------------------------------------------------------------------ blocked, mixed

BLOCKED_ROUNDS = 66  # blocked_after_s (11 minutes) of 10 s rounds


def half_idle(make_idle=blocked, make_spinning=stalled):
    """node-00's ranks blocked on the host, node-01's spinning."""
    return [job_snapshot("node-00", make_idle, range(8)), job_snapshot("node-01", make_spinning, range(8))]


def test_every_rank_blocked_is_a_stall_once_longer_than_a_healthy_pause() -> None:
    feed = fed()
    feed.repeat(BLOCKED_ROUNDS, lambda _: two_nodes(blocked))
    assert feed.candidates([STALL]) == []  # as long as a checkpoint may last
    feed.add(two_nodes(blocked))
    [c] = feed.candidates([STALL])
    assert c.labels["signature"] == "blocked"
    assert c.labels["job_id"] == "train"
    assert c.summary == "job train: 16 GPUs idle with memory held and no NVLink traffic for 11m"
    assert "blocked on the host" in c.description


def test_ranks_that_freed_their_memory_are_not_a_hang() -> None:
    """The job's processes exited (or crashed) while the allocation stays: an idle allocation, not a hang."""
    feed = fed()
    feed.repeat(BLOCKED_ROUNDS + 30, lambda _: two_nodes(blocked, memory_used_bytes=GIB))
    assert feed.candidates([STALL]) == []


def test_a_long_pause_the_job_came_back_from_raises_the_bar() -> None:
    feed = fed()
    feed.repeat(90, lambda _: two_nodes(blocked))  # a 15-minute checkpoint
    feed.repeat(30, lambda _: two_nodes(training))
    feed.repeat(90, lambda _: two_nodes(blocked))
    assert feed.candidates([STALL]) == []  # 890 s: not yet as long as that checkpoint
    feed.add(two_nodes(blocked))
    assert [c.labels["signature"] for c in feed.candidates([STALL])] == ["blocked"]


def test_a_slow_first_step_does_not_count_as_a_pause() -> None:
    feed = Feed()
    feed.repeat(120, lambda _: two_nodes(blocked, memory_used_bytes=20 * GIB))  # 20 minutes of compilation
    feed.repeat(30, lambda _: two_nodes(training))
    feed.repeat(BLOCKED_ROUNDS + 1, lambda _: two_nodes(blocked))
    assert [c.labels["signature"] for c in feed.candidates([STALL])] == ["blocked"]


def test_an_idle_inference_server_is_not_a_hang() -> None:
    """Multi-GPU inference moving only host traffic (under 3 GB/s per GPU) that goes quiet: no requests."""
    serving = functools.partial(training, nvlink_tx_bytes_per_second=0.0, nvlink_rx_bytes_per_second=0.0)
    feed = Feed()
    feed.repeat(30, lambda _: two_nodes(serving, job="serve"))
    feed.repeat(BLOCKED_ROUNDS + 60, lambda _: two_nodes(blocked, job="serve"))
    assert feed.candidates([STALL]) == []


def test_evaluation_phase_is_not_a_hang() -> None:
    """Lower utilization, little traffic, power well above idle: for as long as it lasts."""
    feed = fed()
    evaluating = functools.partial(training, utilization_ratio=0.62, power_watts=320.0, nvlink_tx_bytes_per_second=1e9)
    feed.repeat(BLOCKED_ROUNDS + 60, lambda _: two_nodes(evaluating, nvlink_rx_bytes_per_second=1e9))
    assert feed.candidates([STALL]) == []


def test_some_ranks_spinning_and_the_others_blocked_is_a_mixed_stall() -> None:
    feed = fed()
    feed.repeat(BLOCKED_ROUNDS, lambda _: half_idle())
    assert feed.candidates([STALL]) == []
    feed.add(half_idle())
    [c] = feed.candidates([STALL])
    assert c.labels["signature"] == "mixed"
    assert c.summary == "job train: 8 GPUs spinning and 8 idle with no NVLink traffic for 11m"


def test_some_ranks_computing_while_the_others_wait_idle_is_not_a_hang() -> None:
    """Rank 0 evaluates alone (hot, no traffic) while the others wait on the host."""
    feed = fed()
    computing = functools.partial(stalled, power_watts=560.0, sm_active_ratio=0.8)
    feed.repeat(BLOCKED_ROUNDS + 30, lambda _: half_idle(make_spinning=computing))
    assert feed.candidates([STALL]) == []


def test_a_blocked_hang_is_held_not_resolved_while_the_job_has_no_baseline() -> None:
    feed = Feed()
    feed.repeat(3, lambda _: two_nodes(training))
    feed.repeat(BLOCKED_ROUNDS + 10, lambda _: two_nodes(blocked))
    out = evaluate([STALL], feed.history, feed.now)
    assert [(c.hold, dict(c.labels)) for c in out] == [(True, {"job_id": "train"})]


# ------------------------------------------------------------------------------------------------ straggler


def straggling(node: str, index: int):
    """The slow rank: thermal clock drop, computes all the time (more power than its waiting peers)."""
    return training(node, index, sm_clock_hertz=1340e6, throttle_reasons=0x20, power_watts=525.0)


def waiting(node: str, index: int):
    return training(node, index, power_watts=430.0, tensor_active_ratio=0.3)


def with_straggler(slow: tuple[str, int] = ("node-01", 5)):
    def make(node: str, index: int):
        return straggling(node, index) if (node, index) == slow else waiting(node, index)

    return two_nodes(make)


def test_straggler_is_named_with_its_gpu_and_job() -> None:
    feed = fed()
    feed.add(with_straggler())
    [c] = feed.candidates([STRAGGLER])
    assert (c.labels["node"], c.labels["gpu"], c.labels["job_id"]) == ("node-01", "5", "train")
    assert c.labels["uuid"] == uuid("node-01", 5)
    assert c.summary == "job train: GPU node-01:5 at 68% of its peers' SM clock (sw_thermal) holds back 15 GPUs"
    assert c.value is not None
    assert abs(c.value - 1340 / 1980) < 1e-9


def test_straggler_in_a_two_gpu_job() -> None:
    feed = Feed()
    feed.repeat(30, lambda _: [job_snapshot("node-00", training, [0, 1])])
    feed.add(
        [snapshot("node-00", [straggling("node-00", 0), waiting("node-00", 1)], {0: ("train", "u"), 1: ("train", "u")})]
    )
    [c] = feed.candidates([STRAGGLER])
    assert c.labels["gpu"] == "0"


def test_slow_gpu_whose_peers_do_not_wait_is_not_a_straggler() -> None:
    """A throttled GPU in a job whose others run at full power (e.g. it is not in the critical path)."""
    feed = fed()
    feed.add(two_nodes(lambda n, i: straggling(n, i) if (n, i) == ("node-00", 3) else training(n, i)))
    assert feed.candidates([STRAGGLER]) == []


def test_every_gpu_slow_is_not_a_straggler() -> None:
    feed = fed()
    feed.add(two_nodes(training, sm_clock_hertz=1300e6, power_watts=430.0))
    assert feed.candidates([STRAGGLER]) == []


def test_straggler_pending_is_held_through_a_data_loader_pause() -> None:
    feed = fed()
    feed.add(two_nodes(training, utilization_ratio=0.08, power_watts=130.0))
    out = evaluate([STRAGGLER], feed.history, feed.now)
    assert [(c.hold, dict(c.labels)) for c in out] == [(True, {"job_id": "train"})]


def test_straggler_needs_a_baseline() -> None:
    feed = Feed()
    feed.repeat(3, lambda _: two_nodes(training))
    feed.add(with_straggler())
    assert feed.candidates([STRAGGLER]) == []


@given(st.lists(st.integers(0, 50).map(float), min_size=1, max_size=12), st.data())
def test_peer_median_leaves_the_gpu_itself_out(values: list[float], data: st.DataObject) -> None:
    value = data.draw(st.sampled_from(values))
    others = list(values)
    others.remove(value)
    expected = statistics.median(others) if others else None
    assert _median_without(sorted(values), value) == expected


def test_every_alert_carries_its_rules_advice_and_job_alerts_their_nodes() -> None:
    feed = fed()
    for _ in range(6):
        feed.add(two_nodes(stalled))
    rules = {r.name: r for r in BUILTIN_RULES}
    result = step({}, feed.candidates([STALL]), rules, feed.now)
    [alert] = result.states.values()
    assert alert.annotations["runbook"] == rules[COMMUNICATION_STALL].action
    assert alert.annotations["runbook"].startswith("The job makes no progress")
    assert alert.labels["nodes"] == "node-00,node-01"
