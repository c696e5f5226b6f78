"""What ``History`` and ``FabricWindow`` keep incrementally each round gives what a straightforward recomputation from
the rounds gives: GPU series, job summaries, job references and their medians, port series, memory and references,
peer rates, and the fabric and straggler rules' shortcuts. Each test feeds a few hundred random rounds (GPUs and
ports that come and go, counters that move and reset, values that are missing) into a short window, so rounds
expire all the time, and compares after every round."""

from __future__ import annotations

import random
import statistics
from collections import deque
from dataclasses import replace
from typing import Any

from gpulens.alerts import checks, detect, fabricchecks
from gpulens.alerts.fabrichistory import REFERENCE_SETTLED_ROUNDS as PORT_SETTLED
from gpulens.alerts.fabrichistory import Baseline, _Reference
from gpulens.alerts.history import History, JobRound, Round, summarise_job
from gpulens.alerts.jobround import (
    REFERENCE_MIN_SHARE,
    REFERENCE_SETTLED_ROUNDS,
    nvlink_bytes_per_second,
    traffic_bytes_per_second,
)
from gpulens.alerts.rules import builtin_rules
from gpulens.fabricmodel import NicReading
from gpulens.model import GpuJob, GpuReading, NodeSnapshot

from .fabricsupport import nic
from .support import healthy_gpu, uuid

WINDOW = 120.0
NODES = ("node-00", "node-01", "node-02")
RULES = {r.name: r for r in builtin_rules()}


def _maybe(rng: random.Random, value: Any, none: float = 0.1) -> Any:
    return None if rng.random() < none else value


def _gpu(rng: random.Random, node: str, index: int) -> GpuReading:
    return healthy_gpu(
        node,
        index,
        up=rng.random() > 0.05,
        utilization_ratio=_maybe(rng, rng.choice([0.0, 0.02, 0.3, 0.6, 0.97, 1.0])),
        power_watts=_maybe(rng, rng.choice([70.0, 300.0, 560.0, 561.0, rng.uniform(50, 700)])),
        sm_clock_hertz=rng.choice([None, 0, 1980e6, 1500e6, rng.uniform(1e9, 2e9)]),
        sm_active_ratio=_maybe(rng, rng.random()),
        memory_used_bytes=_maybe(rng, rng.choice([1 << 30, 68 << 30, rng.randrange(1 << 36)])),
        nvlink_tx_bytes_per_second=_maybe(rng, rng.choice([0.0, 50e9, rng.uniform(0, 1e11)]), 0.3),
        nvlink_rx_bytes_per_second=_maybe(rng, rng.choice([-0.0, 50e9, rng.uniform(0, 1e11)]), 0.3),
        pcie_tx_bytes_per_second=_maybe(rng, rng.uniform(0, 1e10), 0.3),
        pcie_rx_bytes_per_second=_maybe(rng, rng.uniform(0, 1e10), 0.3),
    )


# ------------------------------------------------------------------------------------------------ GPUs and jobs


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def reference_summary(time: float, readings: list[GpuReading]) -> JobRound:
    """``summarise_job`` written plainly, one field at a time."""
    clocks = [r.sm_clock_hertz for r in readings if r.sm_clock_hertz]
    clock_median = _median(list(clocks))
    traffic = [traffic_bytes_per_second(r) for r in readings]
    utilization = [r.utilization_ratio for r in readings if r.utilization_ratio is not None]
    memory = [float(r.memory_used_bytes) for r in readings if r.memory_used_bytes is not None]
    power = [r.power_watts for r in readings if r.power_watts is not None]
    present_traffic = [t for t in traffic if t is not None]
    return JobRound(
        time=time,
        gpus=len(readings),
        utilization_min=min(utilization, default=None),
        utilization_median=_median(list(utilization)),
        utilization_max=max(utilization, default=None),
        traffic_max=max(present_traffic, default=None),
        traffic_median=_median(traffic),
        nvlink_median=_median([nvlink_bytes_per_second(r) for r in readings]),
        power_max=max(power, default=None),
        power_median=_median([r.power_watts for r in readings]),
        sm_active_median=_median([r.sm_active_ratio for r in readings]),
        clock_ratio_min=min(clocks) / clock_median if clocks and clock_median else None,
        memory_min=min(memory, default=None),
        memory_median=_median(list(memory)),
    )


class _PlainJobs:
    """Each job's rounds and reference as the history kept them before: lists, medians sorted from scratch."""

    def __init__(self) -> None:
        self.rounds: dict[str, list[JobRound]] = {}
        self.reference: dict[str, list[JobRound]] = {}

    def add(self, round_: Round) -> None:
        for job_id, view in round_.jobs.items():
            readings = [r for u in view.gpus if (r := round_.gpus.get(u)) is not None and r.up]
            if not readings:
                continue
            summary = reference_summary(round_.time, readings)
            self.rounds.setdefault(job_id, []).append(summary)
            reference = self.reference.setdefault(job_id, [])
            fits = summary.is_reference
            if fits and len(reference) >= REFERENCE_SETTLED_ROUNDS:
                usual = _median([r.traffic_median for r in reference])
                assert summary.traffic_median is not None
                fits = usual is None or summary.traffic_median >= REFERENCE_MIN_SHARE * usual
            if fits:
                reference.append(summary)
                self.reference[job_id] = [r for r in reference if r.time >= summary.time - WINDOW]
        horizon = round_.time - WINDOW
        for job_id in list(self.rounds):
            kept = [r for r in self.rounds[job_id] if r.time >= horizon]
            if kept:
                self.rounds[job_id] = kept
            else:
                del self.rounds[job_id]
                del self.reference[job_id]


def _gpu_round(rng: random.Random, t: float) -> list[NodeSnapshot]:
    snapshots = []
    for node in NODES:
        if rng.random() < 0.1:
            continue  # the node missed the round
        gpus = tuple(_gpu(rng, node, i) for i in range(4) if rng.random() > 0.08)
        jobs = []
        for reading in gpus:
            job = "wide" if reading.gpu < 2 else f"{node}-{reading.gpu % 2 if t % 70 else 9}"
            jobs.append(GpuJob(node, reading.gpu, reading.uuid, job, "alice"))
        snapshots.append(NodeSnapshot(node=node, timestamp=t, source="test", gpus=gpus, jobs=tuple(jobs)))
    return snapshots


def test_gpu_series_and_job_tracks_are_what_the_rounds_give() -> None:
    rng = random.Random(7)
    history = History(WINDOW)
    plain = _PlainJobs()
    t = 0.0
    for _ in range(400):
        t += rng.choice([10.0, 10.0, 10.0, 0.0, 30.0, 95.0])
        history.add(t, _gpu_round(rng, t))
        latest = history.latest
        assert latest is not None
        plain.add(latest)
        horizon = t - WINDOW
        seen = {u for r in history.rounds for u in r.gpus}
        for node in NODES:
            for i in range(4):
                u = uuid(node, i)
                expected = [(r.time, r.gpus[u]) for r in history.rounds if u in r.gpus]
                assert list(history.series(u)) == expected
                assert (u in seen) == bool(history.series(u))
        assert all(r.time >= horizon for r in history.rounds)
        for job_id in {*plain.rounds, *latest.jobs}:
            assert list(history.job_rounds(job_id)) == plain.rounds.get(job_id, [])
            reference = list(history.job_reference(job_id))
            assert reference == plain.reference.get(job_id, [])
            medians = history.job_reference_medians(job_id)
            if job_id in plain.rounds:
                assert medians == tuple(
                    _median([getattr(r, f) for r in reference])
                    for f in ("traffic_median", "nvlink_median", "power_median", "sm_active_median", "memory_median")
                )
            for rounds_min in (1.0, 3.0, 6.0):
                assert detect._job_baseline(history, job_id, rounds_min) == detect.baseline(reference, rounds_min)
        for limit in (0.15, 0.5, 0.99):  # GpuIdleAllocated's idle spell, carried on from the round before
            for reading, jobs in history.up_gpus():
                util = reading.utilization_ratio
                if not jobs or util is None or util >= limit:
                    continue
                since = t
                for when, r in reversed(history.series(reading.uuid)):
                    if not r.up or r.utilization_ratio is None or r.utilization_ratio >= limit:
                        break
                    since = when
                assert checks._idle_since(history, reading.uuid, limit, t) == since


def test_a_summary_is_the_plain_one_for_any_readings() -> None:
    rng = random.Random(11)
    for _ in range(600):
        readings = [_gpu(rng, "node-00", i) for i in range(rng.randint(2, 9))]
        assert summarise_job(5.0, readings) == reference_summary(5.0, readings)


def test_a_reference_with_a_nan_falls_back_to_its_rounds() -> None:
    history = History(WINDOW)
    for k in range(8):
        power = float("nan") if k == 3 else 560.0 + k
        gpus = tuple(
            healthy_gpu("node-00", i, utilization_ratio=0.97, power_watts=power, nvlink_tx_bytes_per_second=50e9)
            for i in range(2)
        )
        jobs = tuple(GpuJob("node-00", i, uuid("node-00", i), "j") for i in range(2))
        history.add(10.0 * k, [NodeSnapshot("node-00", 10.0 * k, "t", gpus=gpus, jobs=jobs)])
    assert history.job_reference_medians("j") is None
    reference = history.job_reference("j")
    assert len(reference) == 8
    found = detect._job_baseline(history, "j", 6.0)
    assert found is not None
    assert repr(found) == repr(detect.baseline(reference, 6.0))


def test_the_straggler_shortcut_skips_only_jobs_without_a_straggler() -> None:
    """``_peers_may_wait`` false means ``_straggling`` finds no GPU of the job (random jobs and baselines)."""
    rng = random.Random(3)
    rule = RULES["JobStraggler"]
    skipped = 0
    for _ in range(3000):
        readings = [
            healthy_gpu(
                "n",
                i,
                power_watts=_maybe(rng, rng.choice([500.0, 560.0, rng.uniform(300, 700)])),
                sm_clock_hertz=rng.choice([1980e6, 1500e6]),
                throttle_reasons=rng.choice([0, 0, 0, 0x20]),
            )
            for i in range(rng.randint(1, 9))
        ]
        base = rng.uniform(300, 800)
        job = detect._Job(readings)
        found = [r for r in readings if detect._straggling(rule, r, job, base) is not None]
        if not detect._peers_may_wait(readings, rule.threshold("peer_power_ratio") * base):
            skipped += 1
            assert found == []
    assert skipped > 100


# ------------------------------------------------------------------------------------------------ ports


class _PlainPort:
    """One port as the fabric window kept it before: memory updated reading by reading, references noted alike."""

    def __init__(self) -> None:
        self.last_up: float | None = None
        self.down_since: float | None = None
        self.best_rate: float | None = None
        self.best_width: int | None = None
        self.wait = _Reference()
        self.cnp = _Reference()

    def note(self, now: float, reading: NicReading) -> None:
        if reading.up:
            self.last_up, self.down_since = now, None
            rate, width = reading.rate_bytes_per_second, reading.link_width
            if rate and (self.best_rate is None or rate > self.best_rate):
                self.best_rate = rate
            if width and (self.best_width is None or width > self.best_width):
                self.best_width = width
            self.wait.note(now, reading.transmit_wait_per_second, WINDOW)
            self.cnp.note(now, reading.cnp_handled_per_second, WINDOW)
        elif self.last_up is not None and self.down_since is None:
            self.down_since = now


def _port(rng: random.Random, node: str, device: str, before: NicReading | None) -> NicReading:
    counters = {
        name: (getattr(before, name) or 0) + (rng.random() < 0.05) * rng.randint(1, 30)
        if before is not None and rng.random() > 0.02
        else rng.choice([None, 0, 0, 5])
        for name in (
            "symbol_errors_total",
            "link_downed_total",
            "receive_errors_total",
            "local_link_integrity_errors_total",
        )
    }
    return nic(
        node,
        device,
        [int(device[-1])],
        up=rng.random() > 0.1,
        rate_bytes_per_second=rng.choice([50e9, 50e9, 25e9, None]),
        link_width=rng.choice([4, 4, 2, None]),
        transmit_bytes_per_second=_maybe(rng, rng.choice([0.0, 46e9, rng.uniform(0, 5e10)])),
        receive_bytes_per_second=_maybe(rng, rng.choice([0.0, 46e9, rng.uniform(0, 5e10)])),
        transmit_wait_per_second=_maybe(rng, rng.choice([0.0, 0.5, 2.0, 1e5, 5e6, float("inf")]), 0.2),
        cnp_handled_per_second=_maybe(rng, rng.choice([0.0, 10.0, 5e3]), 0.5),
        **counters,
    )


def test_port_series_memory_references_and_rule_shortcuts_are_what_the_rounds_give() -> None:
    rng = random.Random(5)
    history = History(WINDOW)
    fabric = history.fabric
    plain: dict[tuple[str, str, int], _PlainPort] = {}
    rounds: deque[tuple[float, list[NicReading]]] = deque()
    last: dict[tuple[str, str, int], NicReading] = {}
    t = 0.0
    for _ in range(300):
        t += rng.choice([10.0, 10.0, 10.0, 30.0, 130.0])
        nics = []
        for node in NODES[:2]:
            for device in ("mlx5_0", "mlx5_1", "mlx5_2"):
                if rng.random() < 0.1:
                    continue  # not read this round
                key = (node, device, 1)
                reading = last[key] = _port(rng, node, device, last.get(key))
                nics.append(reading)
        snapshots = [NodeSnapshot(node, t, "t", nics=tuple(n for n in nics if n.node == node)) for node in NODES[:2]]
        history.add(t, snapshots)
        rounds.append((t, nics))
        while rounds[0][0] < t - WINDOW:
            rounds.popleft()
        for reading in nics:
            plain.setdefault(reading.key, _PlainPort()).note(t, reading)
        for key in [k for k in plain if not any(n.key == k for _, ns in rounds for n in ns)]:
            del plain[key]
        assert list(fabric.nics) == nics
        assert [(n, fabric.port(n.key)) for n in nics] == list(fabric.ports())
        for key, port in plain.items():
            assert list(fabric.port_series(key)) == [(when, n) for when, ns in rounds for n in ns if n.key == key]
            memory = fabric.memory(key)
            assert (memory.last_up, memory.down_since, memory.best_rate, memory.best_width) == (
                port.last_up,
                port.down_since,
                port.best_rate,
                port.best_width,
            )
            wait = port.wait.median() if len(port.wait.values) >= PORT_SETTLED else None
            cnp = port.cnp.median() if len(port.cnp.values) >= PORT_SETTLED else None
            assert fabric.baseline(key) == Baseline(wait, cnp)
        for reading in nics:
            peers = sorted(
                n.rate_bytes_per_second
                for n in nics
                if n is not reading
                and n.node == reading.node
                and n.link_layer == reading.link_layer
                and n.up
                and n.rate_bytes_per_second
            )
            assert fabric.peer_rate(reading) == (statistics.median(peers) if peers else None)
        _assert_rule_shortcuts(history, t)


def _assert_rule_shortcuts(history: History, now: float) -> None:
    """The flapping, error and degraded-link rules skip ports without asking ``flaps``, ``increase`` or
    ``peer_rate``: they find what asking every port finds."""
    fabric = history.fabric
    degraded = RULES["IbLinkDegraded"]
    for ratio in (degraded.threshold("peer_rate_ratio"), 0.5, 0.99, 1.0, 0.0):
        rule = replace(degraded, thresholds={**degraded.thresholds, "peer_rate_ratio": ratio})
        found = {c.labels["device"] + c.labels["node"] for c in fabricchecks.ib_link_degraded(rule, history, now)}
        slow = set()
        for n in fabric.nics:
            rate, memory = n.rate_bytes_per_second, fabric.memory(n.key)
            if not n.up or not rate:
                continue
            peers = fabric.peer_rate(n)
            if (
                (n.link_width and memory.best_width and n.link_width < memory.best_width)
                or (memory.best_rate and rate < memory.best_rate)
                or (peers and rate < ratio * peers)
            ):
                slow.add(n.device + n.node)
        assert found == slow
    flapping = RULES["IbLinkFlapping"]
    window, limit = flapping.threshold("window_s"), flapping.threshold("flaps_max")
    for threshold in (0.0, limit):
        rule = replace(flapping, thresholds={**flapping.thresholds, "flaps_max": threshold})
        found = {c.labels["device"] + c.labels["node"] for c in fabricchecks.ib_link_flapping(rule, history, now)}
        slow = {n.device + n.node for n in fabric.nics if fabricchecks.flaps(fabric, n, now - window) > threshold}
        assert found == slow
    errors = replace(
        RULES["IbErrors"],
        thresholds={**RULES["IbErrors"].thresholds, "symbol_errors_max": 0.0, "receive_errors_max": 0.0},
    )
    window = errors.threshold("window_s")
    found = {c.labels["device"] + c.labels["node"] for c in fabricchecks.ib_errors(errors, history, now)}
    slow = set()
    for n in fabric.nics:
        for name in ("symbol_errors_total", "local_link_integrity_errors_total", "receive_errors_total"):
            if fabric.increase(n.key, now - window, lambda r, name=name: getattr(r, name)):  # type: ignore[misc]
                slow.add(n.device + n.node)
    assert found == slow
