"""JobCommunicationSlow over the simulator's NCCL Inspector: fabric congestion, a port at half its rate and a
straggler lower a job's bus bandwidth and the rule fires on that job, naming its communicator (and, for the port,
the node beside it); checkpoints, throttled and power-capped GPUs, host contention and jobs without the Inspector
raise nothing."""

from __future__ import annotations

import functools

from gpulens.alerts.catalogue import JOB_COMMUNICATION_SLOW
from gpulens.alerts.replay import FiredAlert, replay
from gpulens.alerts.rules import builtin_rules
from gpulens.exporter.sim import SimCluster, parse_scenario
from gpulens.exporter.sim.inspectorsim import NIC_BUS_BYTES_PER_SECOND
from gpulens.ncclinspect import size_class

RULES = [r for r in builtin_rules() if r.name == JOB_COMMUNICATION_SLOW]
FAULT_AT_S = 20 * 60
WITHIN_S = RULES[0].for_s + 3 * 10

SCENARIO = """
[cluster]
nodes = 8
gpus_per_node = 8
gpu_model = "H100-SXM5-80GB"
seed = 17
start = "2026-01-01T00:00:00Z"
duration = "40m"
step = "10s"

[[jobs]]
id = "congested"
user = "a"
kind = "training"
gpus = ["node-00:0-7", "node-01:0-7"]
nccl_inspector = true

[[jobs]]
id = "degraded"
user = "b"
kind = "training"
gpus = ["node-02:0-3", "node-03:0-3"]
nccl_inspector = true

[[jobs]]
id = "straggling"
user = "c"
kind = "training"
gpus = ["node-02:4-7", "node-03:4-7"]
nccl_inspector = true

[[jobs]]
id = "checkpointing"
user = "d"
kind = "training"
gpus = ["node-04:0-7", "node-05:0-7"]
checkpoint_every = "6m"
checkpoint_duration = "2m"
nccl_inspector = true

[[jobs]]
id = "throttled"
user = "e"
kind = "training"
gpus = ["node-06:0-3", "node-07:0-3"]
nccl_inspector = true

[[jobs]]
id = "plain"
user = "f"
kind = "training"
gpus = ["node-06:4-7"]

[[faults]]
kind = "fabric_congestion"
job = "congested"
at = "20m"
duration = "10m"

[[faults]]
kind = "ib_degraded"
node = "node-03"
nic = "mlx5_1"
at = "20m"
duration = "10m"

[[faults]]
kind = "straggler"
gpu = "node-02:5"
at = "20m"
duration = "10m"

[[faults]]
kind = "thermal_throttle"
gpu = "node-06:2"
at = "20m"
duration = "10m"

[[faults]]
kind = "power_cap"
gpu = "node-07:1"
at = "22m"
duration = "10m"

[[faults]]
kind = "host_cpu_contention"
job = "checkpointing"
at = "20m"
duration = "10m"
"""


@functools.cache
def fired() -> tuple[FiredAlert, ...]:
    scenario = parse_scenario(SCENARIO, source="inspector")
    report = replay(SimCluster(scenario), start=scenario.start, end=scenario.end, step_s=scenario.step_s, rules=RULES)
    return tuple(report.alerts)


def test_the_three_faults_fire_on_their_jobs_in_time() -> None:
    alerts = fired()
    start = parse_scenario(SCENARIO, source="inspector").start + FAULT_AT_S
    by_job = {a.labels["job_id"]: a for a in alerts}
    assert set(by_job) == {"congested", "degraded", "straggling"}, [a.labels for a in alerts]
    for alert in alerts:
        assert start <= alert.starts_at <= start + WITHIN_S
        assert alert.labels["collective"] == "AllReduce"
        assert alert.labels["size"] == size_class(256 << 20)
        assert alert.labels["comm"].startswith("0x")
        assert alert.ends_at is not None  # it resolves once the fault ends
    assert "sit on node-03 (rank 5, GPU GPU-" in by_job["degraded"].annotations["description"]  # node-03:1
    assert "sit on node-02 (rank 1, GPU GPU-" in by_job["straggling"].annotations["description"]  # node-02:5
    assert "sit on" not in by_job["congested"].annotations["description"]  # every rank alike: no place named


def test_the_sim_lowers_the_bandwidth_by_the_faults_pace() -> None:
    scenario = parse_scenario(SCENARIO, source="inspector")
    cluster = SimCluster(scenario)
    before = cluster.snapshot("node-00", scenario.start + 10 * 60).inspector
    during = cluster.snapshot("node-00", scenario.start + 25 * 60).inspector
    assert before is not None
    assert during is not None
    assert abs(before.series[0].bus_bytes_per_second / NIC_BUS_BYTES_PER_SECOND - 1) <= 0.03
    assert during.series[0].bus_bytes_per_second < 0.36 * NIC_BUS_BYTES_PER_SECOND
    assert cluster.snapshot("node-06", scenario.start + 25 * 60).inspector is not None


def test_the_files_the_sim_writes_read_back_through_the_agents_reader(tmp_path: object) -> None:
    from pathlib import Path

    from gpulens.exporter.inspectorread import InspectorReader

    folder = Path(str(tmp_path))
    scenario = parse_scenario(SCENARIO, source="inspector")
    cluster = SimCluster(scenario)
    t = scenario.start + 25 * 60
    k = round((t - scenario.start) / scenario.step_s)
    snap = cluster.snapshot("node-03", t)
    reader = InspectorReader(str(folder))
    reader.read(snap)  # the agent starts before the job writes: every line is new to it
    assert cluster.inspector.write_json(str(folder), "node-03", k, t) == 8  # 4 ranks of two jobs
    view = reader.read(snap)
    assert view.records == 8
    assert reader.errors.snapshot() == {}
    want = {(s.job_id, s.bus_bytes_per_second) for s in snap.inspector.series}  # type: ignore[union-attr]
    got = {(s.job_id, s.bus_bytes_per_second) for s in view.series}
    assert {j for j, _ in got} == {"degraded", "straggling"}
    for (job, bus), (job2, bus2) in zip(sorted(want), sorted(got), strict=True):
        assert job == job2
        assert abs(bus / bus2 - 1) < 1e-6  # GB/s printed with six decimals, read back as bytes/s
