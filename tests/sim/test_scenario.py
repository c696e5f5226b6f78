"""Scenario files: defaults, GPU ranges, the examples, and each malformed file rejected with its file, key and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulens.config import ConfigError, parse_timestamp
from gpulens.exporter.sim import CATALOGUE, GpuRef, SimCluster, load_scenario, parse_scenario

EXAMPLES = sorted((Path(__file__).parents[2] / "examples" / "scenarios").glob("*.toml"))

CLUSTER = """[cluster]
nodes = 2
gpus_per_node = 4
duration = "30m"
"""
L40S_NODE = """
[[nodes]]
name = "node-01"
gpu_model = "L40S"
"""
TRAINING = """
[[jobs]]
id = "train"
user = "alice"
kind = "training"
gpus = ["node-00:0-3"]
"""
SINGLE = """
[[jobs]]
id = "solo"
user = "bob"
kind = "training"
gpus = ["node-01:0"]
"""


def test_defaults() -> None:
    s = parse_scenario("[cluster]\nnodes = 2\n")
    assert [n.name for n in s.nodes] == ["node-00", "node-01"]
    assert all(n.gpus == 8 and n.model is CATALOGUE["H100-SXM5-80GB"] for n in s.nodes)
    assert (s.seed, s.step_s, s.duration_s) == (0, 10.0, 3600.0)
    assert s.start == parse_timestamp("2026-01-01T00:00:00Z")
    assert s.end == s.start + 3600.0
    assert (s.jobs, s.faults) == ((), ())


def test_node_names_counts_lists_and_overrides() -> None:
    assert parse_scenario("[cluster]\nnodes = 101\n").nodes[-1].name == "node-100"
    s = parse_scenario(
        '[cluster]\nnodes = ["a1", "b2"]\n[[nodes]]\nname = "b2"\ngpu_model = "L40S"\ngpus_per_node = 2\n'
    )
    assert [(n.name, n.model.name, n.gpus) for n in s.nodes] == [("a1", "H100-SXM5-80GB", 8), ("b2", "L40S", 2)]


def test_gpu_ranges_times_and_job_defaults() -> None:
    text = (
        CLUSTER
        + """
[[jobs]]
id = "a"
user = "u"
kind = "inference"
gpus = ["node-00", "node-01:0,2-3"]
start = "2026-01-01T00:05:00Z"
end = "20m"
"""
    )
    job = parse_scenario(text).jobs[0]
    expected = [GpuRef("node-00", i) for i in range(4)] + [GpuRef("node-01", i) for i in (0, 2, 3)]
    assert list(job.gpus) == expected
    assert job.start == parse_timestamp("2026-01-01T00:05:00Z")
    assert job.end == parse_timestamp("2026-01-01T00:20:00Z")
    assert job.memory_fraction == 0.9  # inference default
    assert job.checkpoint_every_s is None


def test_toml_datetimes_are_accepted() -> None:
    s = parse_scenario("[cluster]\nnodes = 1\nstart = 2026-03-01T12:00:00Z\n")
    assert s.start == parse_timestamp("2026-03-01T12:00:00Z")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_loads_and_runs(path: Path) -> None:
    scenario = load_scenario(path)
    sim = SimCluster(scenario)
    for node in sim.node_names():
        snap = sim.snapshot(node, scenario.start + 60)
        assert snap.node == node
        missing = len(snap.hardware.missing_gpus) if snap.hardware is not None else 0  # gpu_missing: no reading
        assert len(snap.gpus) + missing == next(n.gpus for n in scenario.nodes if n.name == node)


def test_the_examples_the_docs_promise_exist() -> None:
    assert {"healthy.toml", "stall.toml", "faults.toml", "demo.toml"} <= {p.name for p in EXAMPLES}
    healthy = load_scenario(EXAMPLES[0].parent / "healthy.toml")
    assert not healthy.faults
    assert any(n.model.name == "L40S" for n in healthy.nodes)
    assert {f.kind for f in load_scenario(EXAMPLES[0].parent / "stall.toml").faults} == {"comm_stall"}
    demo = load_scenario(EXAMPLES[0].parent / "demo.toml")
    assert len(demo.nodes) == 4
    assert all(n.gpus == 8 and n.model.name == "H100-SXM5-80GB" for n in demo.nodes)
    assert {f.kind for f in demo.faults} >= {"comm_stall", "thermal_throttle"}


# Each malformed scenario marks the line the error must name with "# <-".
MALFORMED = {
    "unknown cluster key": (CLUSTER + "colour = 1  # <-\n", "cluster.colour", "unknown key"),
    "unknown table": (CLUSTER + "[extra]  # <-\nx = 1\n", "extra", "unknown key"),
    "unknown sub-table": (CLUSTER + "[cluster.extra]  # <-\nx = 1\n", "cluster.extra", "unknown key"),
    "unknown job key": (CLUSTER + TRAINING + "priority = 3  # <-\n", "jobs[0].priority", "unknown key"),
    "bad duration": (CLUSTER.replace('"30m"', '"30 minutes"  # <-'), "cluster.duration", "not a duration"),
    "zero step": (CLUSTER + 'step = "0s"  # <-\n', "cluster.step", "longer than zero"),
    "start is an offset": (CLUSTER + 'start = "5m"  # <-\n', "cluster.start", "RFC 3339"),
    "unknown gpu model": (CLUSTER + 'gpu_model = "B200"  # <-\n', "cluster.gpu_model", "unknown GPU model"),
    "override of unknown node": (CLUSTER + '[[nodes]]\nname = "node-07"  # <-\n', "nodes[0].name", "unknown node"),
    "unknown job kind": (CLUSTER + TRAINING.replace('"training"', '"batch"  # <-'), "jobs[0].kind", "unknown kind"),
    "unknown node in gpus": (
        CLUSTER + TRAINING.replace('["node-00:0-3"]', '["node-09:0"]  # <-'),
        "jobs[0].gpus",
        "unknown node 'node-09'",
    ),
    "gpu outside the node": (
        CLUSTER + TRAINING.replace('["node-00:0-3"]', '["node-00:0-4"]  # <-'),
        "jobs[0].gpus",
        "has GPUs 0-3, not 4",
    ),
    "gpu range syntax": (
        CLUSTER + TRAINING.replace('["node-00:0-3"]', '["node-00:a-b"]  # <-'),
        "jobs[0].gpus",
        "not a GPU range",
    ),
    "backwards range": (
        CLUSTER + TRAINING.replace('["node-00:0-3"]', '["node-00:3-1"]  # <-'),
        "jobs[0].gpus",
        "runs backwards",
    ),
    "gpu listed twice": (
        CLUSTER + TRAINING.replace('["node-00:0-3"]', '["node-00:0-3", "node-00:2"]  # <-'),
        "jobs[0].gpus",
        "listed twice",
    ),
    "duplicate job id": (
        CLUSTER + TRAINING + TRAINING.replace('id = "train"', 'id = "train"  # <-'),
        "jobs[1].id",
        "twice",
    ),
    "missing user": (
        CLUSTER + "[[jobs]]  # <-\nid = 'x'\nkind = 'idle'\ngpus = ['node-00:0']\n",
        "jobs[0].user",
        "missing",
    ),
    "end before start": (
        CLUSTER + TRAINING + 'start = "10m"\nend = "5m"  # <-\n',
        "jobs[0].end",
        "after the job's start",
    ),
    "job past the scenario": (CLUSTER + TRAINING + 'end = "45m"  # <-\n', "jobs[0].end", "outside the scenario"),
    "memory fraction above one": (
        CLUSTER + TRAINING + "memory_fraction = 1.5  # <-\n",
        "jobs[0].memory_fraction",
        "0 to 1",
    ),
    "checkpoints on inference": (
        CLUSTER + TRAINING.replace('"training"', '"inference"') + 'checkpoint_every = "5m"  # <-\n',
        "jobs[0].checkpoint_every",
        "only training jobs",
    ),
    "overlapping training jobs": (
        CLUSTER
        + TRAINING
        + TRAINING.replace('id = "train"', 'id = "other"').replace('["node-00:0-3"]', '["node-00:3"]  # <-'),
        "jobs[1].gpus",
        "only notebook jobs may share",
    ),
    "notebook over inference": (
        CLUSTER
        + TRAINING.replace('"training"', '"inference"')
        + TRAINING.replace('id = "train"', 'id = "nb"')
        .replace('"training"', '"notebook"')
        .replace('["node-00:0-3"]', '["node-00:1"]  # <-'),
        "jobs[1].gpus",
        "held by job 'train'",
    ),
    "unknown fault kind": (
        CLUSTER + "[[faults]]\nkind = 'meltdown'  # <-\nat = '1m'\n",
        "faults[0].kind",
        "unknown kind",
    ),
    "unknown fault key": (
        CLUSTER + TRAINING + "[[faults]]\nkind = 'comm_stall'\njob = 'train'\nat = '1m'\nseverity = 2  # <-\n",
        "faults[0].severity",
        "unknown key",
    ),
    "unknown job in a fault": (
        CLUSTER + TRAINING + "[[faults]]\nkind = 'comm_stall'\njob = 'nope'  # <-\nat = '1m'\n",
        "faults[0].job",
        "unknown job 'nope'",
    ),
    "fault without its target": (
        CLUSTER + "[[faults]]  # <-\nkind = 'thermal_throttle'\nat = '1m'\n",
        "faults[0].gpu",
        "missing",
    ),
    "fault with the wrong target": (
        CLUSTER + TRAINING + "[[faults]]\nkind = 'thermal_throttle'\njob = 'train'  # <-\nat = '1m'\n",
        "faults[0].job",
        "names a gpu, not a job",
    ),
    "fault gpu is a range": (
        CLUSTER + "[[faults]]\nkind = 'power_cap'\ngpu = 'node-00:0-1'  # <-\nat = '1m'\n",
        "faults[0].gpu",
        "expected one GPU",
    ),
    "fault gpu outside the node": (
        CLUSTER + "[[faults]]\nkind = 'power_cap'\ngpu = 'node-00:4'  # <-\nat = '1m'\n",
        "faults[0].gpu",
        "has GPUs 0-3, not 4",
    ),
    "fault without at": (
        CLUSTER + "[[faults]]  # <-\nkind = 'exporter_down'\nnode = 'node-00'\n",
        "faults[0].at",
        "missing",
    ),
    "fault after the scenario": (
        CLUSTER + "[[faults]]\nkind = 'exporter_down'\nnode = 'node-00'\nat = '2h'  # <-\n",
        "faults[0].at",
        "outside the scenario",
    ),
    "fault past the scenario": (
        CLUSTER + "[[faults]]\nkind = 'exporter_down'\nnode = 'node-00'\nat = '20m'\nduration = '20m'  # <-\n",
        "faults[0].duration",
        "past the end",
    ),
    "xid without a code": (
        CLUSTER + "[[faults]]  # <-\nkind = 'xid'\ngpu = 'node-00:1'\nat = '1m'\n",
        "faults[0].xid",
        "missing",
    ),
    "xid with a duration": (
        CLUSTER + "[[faults]]\nkind = 'xid'\ngpu = 'node-00:1'\nat = '1m'\nxid = 79\nduration = '1m'  # <-\n",
        "faults[0].duration",
        "single event",
    ),
    "sxid with a duration": (
        CLUSTER + "[[faults]]\nkind = 'sxid'\nnode = 'node-00'\nat = '1m'\nsxid = 24007\nduration = '5m'  # <-\n",
        "faults[0].duration",
        "single event",
    ),
    "sxid on a switch beyond 15": (
        CLUSTER + "[[faults]]\nkind = 'sxid'\nnode = 'node-00'\nat = '1m'\nsxid = 24007\nswitch = 16  # <-\n",
        "faults[0].switch",
        "<= 15",
    ),
    "xid code on another kind": (
        CLUSTER + "[[faults]]\nkind = 'gpu_lost'\ngpu = 'node-00:1'\nat = '1m'\nxid = 79  # <-\n",
        "faults[0].xid",
        "only xid and kernel_xid faults",
    ),
    "stall of a single-gpu job": (
        CLUSTER + SINGLE + "[[faults]]\nkind = 'comm_stall'\njob = 'solo'  # <-\nat = '1m'\n",
        "faults[0].job",
        "2 or more GPUs",
    ),
    "stall outside the job's run": (
        CLUSTER
        + TRAINING
        + 'end = "10m"\n'
        + "[[faults]]\nkind = 'comm_stall'\njob = 'train'\nat = '5m'\nduration = '10m'  # <-\n",
        "faults[0].duration",
        "inside job 'train'",
    ),
    "straggler without a job": (
        CLUSTER + "[[faults]]\nkind = 'straggler'\ngpu = 'node-00:1'  # <-\nat = '1m'\n",
        "faults[0].gpu",
        "needs a job",
    ),
    "nvlink errors on a pcie-only gpu": (
        CLUSTER + L40S_NODE + "[[faults]]\nkind = 'nvlink_errors'\ngpu = 'node-01:0'  # <-\nat = '1m'\n",
        "faults[0].gpu",
        "no NVLink",
    ),
    "bare date as a time": (
        CLUSTER + TRAINING + "start = 2026-01-01  # <-\n",
        "jobs[0].start",
        "RFC 3339 time",
    ),
    "xid code below one": (
        CLUSTER + "[[faults]]\nkind = 'xid'\ngpu = 'node-00:1'\nat = '1m'\nxid = 0  # <-\n",
        "faults[0].xid",
        ">= 1",
    ),
    "unknown key in a fault sub-table": (
        CLUSTER + "[[faults]]\nkind = 'gpu_lost'\ngpu = 'node-00:1'\nat = '1m'\ncolour = 'red'  # <-\n",
        "faults[0].colour",
        "unknown key (expected one of: at, duration, gpu, kind)",
    ),
    "missing cluster table": ("[[jobs]]\nid = 'x'\n", "cluster", "missing the [cluster] table"),
    "hang_mixed without ranks": (
        CLUSTER + TRAINING + "[[faults]]  # <-\nkind = 'hang_mixed'\njob = 'train'\nat = '1m'\n",
        "faults[0].ranks",
        "missing required key",
    ),
    "hang_mixed rank outside the job": (
        CLUSTER + TRAINING + "[[faults]]\nkind = 'hang_mixed'\njob = 'train'\nat = '1m'\nranks = ['node-01:0']  # <-\n",
        "faults[0].ranks",
        "not one of job 'train''s GPUs",
    ),
    "hang_mixed with every rank idle": (
        CLUSTER + TRAINING + "[[faults]]\nkind = 'hang_mixed'\njob = 'train'\nat = '1m'\nranks = ['node-00']  # <-\n",
        "faults[0].ranks",
        "some ranks must keep spinning",
    ),
    "ranks on another hang": (
        CLUSTER
        + TRAINING
        + "[[faults]]\nkind = 'hang_blocked'\njob = 'train'\nat = '1m'\nranks = ['node-00:0']  # <-\n",
        "faults[0].ranks",
        "unknown key (expected one of: at, duration, job, kind, stuck_ranks)",
    ),
    "hang of a single-GPU job": (
        CLUSTER + SINGLE + "[[faults]]\nkind = 'hang_blocked'\njob = 'solo'  # <-\nat = '1m'\n",
        "faults[0].job",
        "needs a training job with 2 or more GPUs",
    ),
    "checkpoint longer than 15 minutes": (
        CLUSTER + TRAINING + 'checkpoint_every = "20m"\ncheckpoint_duration = "16m"  # <-\n',
        "jobs[0].checkpoint_duration",
        "at most 15m",
    ),
    "checkpoint duration without checkpoints": (
        CLUSTER + TRAINING + 'checkpoint_duration = "5m"  # <-\n',
        "jobs[0].checkpoint_duration",
        "needs checkpoint_every",
    ),
    "checkpoint as long as its period": (
        CLUSTER + TRAINING + 'checkpoint_every = "5m"\ncheckpoint_duration = "5m"  # <-\n',
        "jobs[0].checkpoint_duration",
        "shorter than checkpoint_every",
    ),
    "eval duration without eval_every": (
        CLUSTER + TRAINING + 'eval_duration = "2m"  # <-\n',
        "jobs[0].eval_duration",
        "needs eval_every",
    ),
    "eval as long as its period": (
        CLUSTER + TRAINING + 'eval_every = "5m"\neval_duration = "6m"  # <-\n',
        "jobs[0].eval_duration",
        "shorter than eval_every",
    ),
    "first step past the job's end": (
        CLUSTER + TRAINING + 'first_step = "30m"  # <-\n',
        "jobs[0].first_step",
        "must end before the job does",
    ),
    "phases of an inference job": (
        CLUSTER + SINGLE.replace("training", "inference") + 'eval_every = "5m"  # <-\n',
        "jobs[0].eval_every",
        "only training jobs",
    ),
}


def marked_line(text: str) -> int | None:
    return next((i for i, line in enumerate(text.splitlines(), start=1) if "# <-" in line), None)


@pytest.mark.parametrize(("text", "key", "message"), list(MALFORMED.values()), ids=list(MALFORMED))
def test_malformed_scenarios_name_file_key_and_line(tmp_path: Path, text: str, key: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    err = info.value
    assert err.file == str(path)
    assert err.key == key
    assert err.line == marked_line(text)
    assert message in err.message
    assert str(path) in str(err)


def test_toml_syntax_errors_carry_the_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text('[cluster]\nnodes = 2\nstep = "10s\n')
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert info.value.file == str(path)
    assert info.value.line == 3
    assert "TOML syntax error" in info.value.message


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_scenario(tmp_path / "nope.toml")
    assert info.value.file == str(tmp_path / "nope.toml")
