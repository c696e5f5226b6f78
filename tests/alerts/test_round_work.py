"""The work of one engine round, bounded without timing it: the per-GPU rules read each GPU's fields through the
round's columns (``alerts.gpucolumns``, each column built once a round for every rule), the port error and flapping
rules visit only the ports whose counters moved within the window (``FabricWindow.ports_moved``), the GPU error rules
only the GPUs whose error counters moved (``History.gpus_moved``), and a round's expiry walks only the GPUs, jobs,
hosts and job shares the round did not read (``History.walked``, ``FabricWindow.walked``).

A reading that counts its field reads stands in for the simulator's: the reads per GPU of a round of every builtin
rule are the same at 10 and at 40 nodes, and below a bound of a few per field the rules weigh."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from gpulens.alerts.rules import builtin_rules, evaluate
from gpulens.model import GpuReading

from .fabricsupport import fabric_snapshot, host, rails, share
from .support import Feed, healthy_gpu, training, uuid

# Field reads per up GPU in a round of every builtin rule over a healthy, busy cluster: a read per column, and the
# job summaries' and the error rules' own (at the time of writing 45 per GPU before the columns, 39 with them).
READS_PER_GPU_MAX = 40


class CountingReading(GpuReading):
    """A reading that counts reads of its fields (``reads``, over every instance)."""

    __slots__ = ()
    reads: ClassVar[int] = 0
    counting: ClassVar[bool] = False

    def __getattribute__(self, name: str) -> Any:
        if CountingReading.counting and not name.startswith("__"):
            CountingReading.reads += 1
        return super().__getattribute__(name)


def _counting(reading: GpuReading) -> CountingReading:
    return CountingReading(**{f.name: getattr(reading, f.name) for f in dataclasses.fields(reading)})


def _reads_per_gpu(nodes: int) -> float:
    """Field reads per GPU of one round of every builtin rule, the fourth of a steady busy cluster."""
    names = [f"node-{n:03d}" for n in range(nodes)]
    gpus = {n: [_counting(training(n, i)) for i in range(8)] for n in names}
    jobs = {i: (f"job-{n}", "alice") for n in names for i in range(8)}
    snaps = [fabric_snapshot(n, gpus[n], rails(n), {i: jobs[i] for i in range(8)}) for n in names]
    feed, rules = Feed(), builtin_rules()
    for _ in range(3):
        feed.add(snaps)
        evaluate(rules, feed.history, feed.now)
    feed.add(snaps)
    CountingReading.reads, CountingReading.counting = 0, True
    try:
        evaluate(rules, feed.history, feed.now)
    finally:
        CountingReading.counting = False
    assert feed.history.columns().built <= 26  # each column once a round, whatever the number of rules
    return CountingReading.reads / (nodes * 8)


def test_a_rounds_reads_per_gpu_do_not_grow_with_the_cluster_and_stay_bounded() -> None:
    small, large = _reads_per_gpu(10), _reads_per_gpu(40)
    assert small == large
    assert large <= READS_PER_GPU_MAX


def test_the_port_error_rules_visit_only_the_ports_whose_counters_moved() -> None:
    feed = Feed()
    quiet = [fabric_snapshot(f"node-{n}", [healthy_gpu(f"node-{n}", 0)], rails(f"node-{n}")) for n in range(4)]
    feed.add(quiet)
    assert len(feed.history.fabric.ports_moved()) == 32  # a single reading each: nothing to compare yet
    feed.add(quiet)
    feed.add(quiet)
    assert feed.history.fabric.ports_moved() == []
    errors = rails("node-3", 8, symbol_errors_total=50)[7]
    noisy = [*quiet[:3], dataclasses.replace(quiet[3], nics=(*quiet[3].nics[:7], errors))]
    feed.add(noisy)
    moved = feed.history.fabric.ports_moved()
    assert [(nic.node, nic.device) for nic, _ in moved] == [("node-3", "mlx5_7")]
    feed.add(noisy)  # the same count again: still moved within the window (its first and last readings differ)
    assert [(nic.node, nic.device) for nic, _ in feed.history.fabric.ports_moved()] == [("node-3", "mlx5_7")]
    fired = feed.candidates(r for r in builtin_rules() if r.name == "IbErrors")
    assert [(c.labels["node"], c.labels["device"]) for c in fired] == [("node-3", "mlx5_7")]


def _node(n: int, **fields: Any) -> Any:
    node = f"node-{n}"
    return fabric_snapshot(node, [training(node, 0, **fields)], rails(node, 2), {0: (f"job-{n}", "alice")})


def _error_rule_reads(quiet_nodes: int) -> tuple[int, list[tuple[str, str]], set[str]]:
    """Field reads of the GPU error rules over ``quiet_nodes`` quiet GPUs and one whose NVLink replays rose, what
    they fired on, and ``gpus_moved``."""
    feed = Feed()
    quiet = [_node(n) for n in range(quiet_nodes)]
    noisy = _node(quiet_nodes, nvlink_replay_errors_total=7)
    for _ in range(3):
        feed.add([*quiet, _node(quiet_nodes)])
    assert feed.history.gpus_moved() == set()
    feed.add([*quiet, noisy])
    snaps = [dataclasses.replace(s, gpus=tuple(_counting(r) for r in s.gpus)) for s in (*quiet, noisy)]
    feed.add(snaps)  # the same count again: still moved within the window
    rules = [r for r in builtin_rules() if r.name in ("PcieLinkDegraded", "NvlinkErrors", "EccUncorrectable")]
    CountingReading.reads, CountingReading.counting = 0, True
    try:
        fired = [(c.rule, c.labels["node"]) for c in evaluate(rules, feed.history, feed.now) if not c.hold]
    finally:
        CountingReading.counting = False
    return CountingReading.reads, fired, set(feed.history.gpus_moved())


def test_the_gpu_error_rules_visit_only_the_gpus_whose_error_counters_moved() -> None:
    small, fired, moved = _error_rule_reads(5)
    large, fired_large, _ = _error_rule_reads(25)
    assert fired == [("NvlinkErrors", "node-5")]
    assert fired_large == [("NvlinkErrors", "node-25")]
    assert moved == {uuid("node-5", 0)}
    # a quiet GPU is read once to know it up, and once per column the rules pick from (its UUID, its PCIe link's
    # width and generation and their maxima, its row remapping failure): never whole
    assert (large - small) / 20 == 7


def test_a_rounds_expiry_walks_only_what_the_round_did_not_read() -> None:
    feed = Feed(window_s=60.0)
    shares = [share(f"node-{n}", f"job-{n}") for n in range(6)]
    nodes = [dataclasses.replace(_node(n), host=host(f"node-{n}"), job_hosts=(shares[n],)) for n in range(6)]
    for _ in range(10):
        feed.add(nodes)
        assert feed.history.walked == 0
        assert feed.history.fabric.walked == 0
    feed.add(nodes[:4])  # two nodes, their GPU, job, host and job share left: only they are walked
    assert feed.history.walked == 2 + 2
    assert feed.history.fabric.walked == 2 + 2
    for _ in range(7):  # until they leave the 60 s window
        feed.add(nodes[:4])
    assert feed.history.walked == 0
    assert feed.history.fabric.walked == 0
    assert len(feed.history.fabric.host_series("node-5")) == 0
    assert feed.history.job_rounds("job-5") == ()
    assert feed.history.series(nodes[5].gpus[0].uuid) == ()
