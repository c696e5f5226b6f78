"""Detection quality over the simulator: every fault raises its alert, at the right GPU or job, in time; nothing else.

Each scenario is replayed end to end (History -> evaluate -> step) at its own step, and the alerts that fired are
matched against what its faults call for (``expect.py``). The example scenarios are also checked against lists
written out by hand, so that the expectation logic cannot hide a mistake it shares with the rules.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from gpulens.alerts.catalogue import (
    COMMUNICATION_STALL,
    FABRIC_CONGESTION,
    IB_ERRORS,
    IB_LINK_DEGRADED,
    IB_LINK_DOWN,
    IB_LINK_FLAPPING,
    JOB_INPUT_BOUND,
)
from gpulens.alerts.rules import builtin_rules

from . import scenarios
from .expect import KindTally, Outcome, RuleTally, run, tally

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scenarios"
RULES = builtin_rules()


def subjects(outcome: Outcome) -> list[tuple[str, str]]:
    """(alertname, subject) of every fired alert, in firing order."""
    out = []
    for a in outcome.fired:
        labels = a.labels
        if "gpu" in labels:
            subject = f"{labels['node']}:{labels['gpu']}"
        else:
            subject = labels.get("job_id") or labels.get("node", "")
        out.append((a.alertname, subject))
    return out


def assert_clean(outcome: Outcome) -> None:
    assert not outcome.missed, outcome.describe()
    assert not outcome.false_alerts, outcome.describe()
    assert not outcome.refired, outcome.describe()


def assert_in_time(outcome: Outcome, step_s: float) -> None:
    assert outcome.late(RULES, step_s) == []


def signatures(outcome: Outcome) -> list[tuple[str, str]]:
    """(job, signature) of every CommunicationStall that fired, in firing order."""
    return [(a.labels["job_id"], a.labels["signature"]) for a in outcome.fired if a.alertname == "CommunicationStall"]


# ------------------------------------------------------------------------------------------------ the examples


def test_stall_example_raises_only_the_stall() -> None:
    outcome = run((EXAMPLES / "stall.toml").read_text(), "stall.toml")
    assert_clean(outcome)
    assert subjects(outcome) == [("CommunicationStall", "llm-pretrain")]
    [stall] = outcome.fired
    assert stall.labels["signature"] == "spinning"
    assert stall.starts_at - outcome.expected[0].start == 300.0
    assert stall.summary == "job llm-pretrain: 16 GPUs at 100% with no NVLink traffic for 5m"
    assert stall.ends_at is not None


def test_hangs_example_raises_each_signature_on_its_job() -> None:
    outcome = run((EXAMPLES / "hangs.toml").read_text(), "hangs.toml")
    assert_clean(outcome)
    assert_in_time(outcome, 10.0)
    assert signatures(outcome) == [
        ("spin", "spinning"),
        ("blocked", "blocked"),
        ("mixed", "mixed"),
        ("pcie-blocked", "blocked"),
    ]
    assert {a.alertname for a in outcome.fired} == {"CommunicationStall"}
    delays = {a.labels["job_id"]: a.starts_at - outcome.expected[i].start for i, a in outcome.detected.items()}
    assert delays == {"spin": 300.0, "blocked": 960.0, "mixed": 960.0, "pcie-blocked": 960.0}
    mixed = next(a for a in outcome.fired if a.labels["job_id"] == "mixed")
    assert mixed.summary == "job mixed: 4 GPUs spinning and 4 idle with no NVLink traffic for 16m"
    blocked = next(a for a in outcome.fired if a.labels["job_id"] == "pcie-blocked")
    assert blocked.summary == "job pcie-blocked: 4 GPUs idle with memory held and no PCIe traffic for 16m"


def test_confounders_example_raises_nothing() -> None:
    """Checkpoints of 15 minutes, evaluation phases and slow first steps, on NVLink and PCIe-only nodes."""
    outcome = run((EXAMPLES / "confounders.toml").read_text(), "confounders.toml")
    assert outcome.fired == [], outcome.describe()
    assert outcome.rounds == 480


def test_healthy_example_raises_nothing() -> None:
    outcome = run((EXAMPLES / "healthy.toml").read_text(), "healthy.toml")
    assert outcome.fired == []


def test_demo_example() -> None:
    outcome = run((EXAMPLES / "demo.toml").read_text(), "demo.toml")
    assert_clean(outcome)
    assert sorted(subjects(outcome)) == [
        ("CommunicationStall", "llm-pretrain"),
        ("GpuIdleAllocated", "node-03:4"),
        ("GpuIdleAllocated", "node-03:5"),
        ("GpuThermalThrottling", "node-03:2"),
        ("JobInefficient", "reserved-eval"),  # the idle job: its GPUs held and idle past held_s
    ]


def test_faults_example_raises_each_faults_alert() -> None:
    outcome = run((EXAMPLES / "faults.toml").read_text(), "faults.toml")
    assert_clean(outcome)
    assert_in_time(outcome, 10.0)
    expected = {
        ("CommunicationStall", "pretrain"),
        ("CommunicationStall", "hang-spin"),
        ("CommunicationStall", "hang-blocked"),
        ("CommunicationStall", "hang-mixed"),
        ("JobStraggler", "node-02:5"),
        ("GpuThermalThrottling", "node-02:5"),  # the straggler is thermally slowed (sw_thermal)
        ("GpuMemorySaturated", "node-03:0"),
        ("GpuThermalThrottling", "node-03:1"),
        ("GpuPowerCapped", "node-05:2"),
        ("PcieLinkDegraded", "node-03:2"),
        ("PcieBandwidthSaturated", "node-03:3"),
        ("NvlinkErrors", "node-05:6"),
        ("XidError", "node-05:1"),
        ("XidError", "node-05:4"),  # kernel_xid: from the kernel log alone
        ("XidError", "node-04:7"),  # XID 79 on the GPU lost at once: from the kernel log
        ("GpuLost", "node-04:7"),
        ("GpuIdleAllocated", "node-03:4"),
        ("GpuIdleAllocated", "node-03:5"),
        ("ExporterDown", "node-04"),
        ("GpuDriverHung", "node-04"),
        *(("NvlinkBandwidthSaturated", f"node-02:{i}") for i in range(8)),
        ("GpuMissing", "node-04"),  # node-04:6, by its PCI address
        ("GpuFabricNotReady", "node-06"),  # nv-fabricmanager
        *(("GpuFabricNotReady", f"node-06:{i}") for i in range(8)),
        ("GpuConfigDrift", "node-03"),  # nvidia_peermem, unlike the other six nodes
        ("NvswitchFatalSxid", "node-03"),  # SXid 24007, three kernel-log lines, one event
    }
    assert set(subjects(outcome)) == expected
    # each once, but hang-spin twice: its hang, then (NCCL RAS) its rank_dead
    assert len(outcome.fired) == len(expected) + 1
    assert sorted(a.labels["signature"] for a in outcome.fired if a.labels.get("job_id") == "hang-spin") == [
        "rank_dead",
        "spinning",
    ]
    kinds, rules = tally([outcome])
    assert kinds["nvlink_saturation"] == KindTally(injected=1, alerting=1, detected=1)
    assert rules["NvlinkBandwidthSaturated"] == RuleTally(required=8, detected=8, fired=8, false=0)  # one per GPU
    assert kinds["straggler"] == KindTally(1, 1, 1)  # JobStraggler and GpuThermalThrottling both fired
    assert kinds["dead_profiling"] == KindTally(1, 0, 0)  # a confounder: calls for no alert
    assert {
        k: kinds[k].detected for k in ("comm_stall", "hang_spinning", "hang_blocked", "hang_mixed")
    } == dict.fromkeys(("comm_stall", "hang_spinning", "hang_blocked", "hang_mixed"), 1)
    assert kinds["rank_dead"] == KindTally(1, 1, 1)
    assert kinds["kernel_xid"] == KindTally(1, 1, 1)  # from the kernel log alone
    assert kinds["sxid"] == KindTally(1, 1, 1)  # NvswitchFatalSxid, from the kernel log
    assert sum(k.injected for k in kinds.values()) == 25
    assert {k: kinds[k] for k in ("gpu_missing", "fabric_not_ready", "peermem_missing")} == dict.fromkeys(
        ("gpu_missing", "fabric_not_ready", "peermem_missing"), KindTally(1, 1, 1)
    )
    assert kinds["nvml_hang"] == KindTally(1, 1, 1)  # GpuDriverHung, and no ExporterDown for it


def test_fabric_example_raises_each_faults_alert_on_its_port_and_job() -> None:
    outcome = run((EXAMPLES / "fabric.toml").read_text(), "fabric.toml")
    assert_clean(outcome)
    ports = {
        (a.alertname, a.labels["node"], a.labels["device"], a.labels.get("job", ""))
        for a in outcome.fired
        if "device" in a.labels
    }
    congested = {("FabricCongestion", n, f"mlx5_{i}", "finetune") for n in ("node-02", "node-03") for i in range(8)}
    saturated = {
        ("FabricBandwidthSaturated", n, f"mlx5_{i}", "a100-train") for n in ("node-05", "node-06") for i in range(4)
    }
    assert ports == {
        ("IbLinkDegraded", "node-05", "mlx5_1", "a100-train"),
        ("IbLinkDown", "node-01", "mlx5_2", "pretrain"),
        ("IbLinkFlapping", "node-02", "mlx5_5", "finetune"),
        ("IbErrors", "node-06", "mlx5_3", "a100-train"),
        *congested,
        *saturated,
    }
    inputs = {(a.labels["job_id"], a.labels["node"]) for a in outcome.fired if a.alertname == "JobInputBound"}
    assert inputs == {("local", "node-04"), ("serve", "node-07")}
    stalls = [a for a in outcome.fired if a.alertname == "CommunicationStall"]
    # pretrain hangs on its 10-minute link-down: its stall shows, annotated with the link, a member of its incident
    assert [(a.labels["job_id"], a.muted) for a in stalls] == [("pretrain", None)]
    assert stalls[0].annotations.get("incident", "").startswith("inc-")
    assert "IbLinkDown node-01 mlx5_2" in stalls[0].annotations.get("cause", "")
    slow = {a.labels["job_id"] for a in outcome.fired if a.alertname == "JobCommunicationSlow"}
    assert slow == {"finetune", "a100-train"}  # NCCL's Inspector: the congestion, the port at half its rate
    hosts = {(a.alertname, a.labels["node"]) for a in outcome.fired if a.alertname.startswith("Host")}
    assert hosts == {("HostCpuContention", "node-04"), ("HostMemoryPressure", "node-07")}  # what starves each
    assert len(outcome.fired) == len(ports) + len(inputs) + len(stalls) + len(slow) + len(hosts)  # each once


@pytest.mark.parametrize(
    ("kind", "alertname"),
    [("ib_link_flap", "IbLinkFlapping"), ("ib_degraded", "IbLinkDegraded"), ("ib_errors", "IbErrors")],
)
def test_a_port_fault_named_by_job_acts_on_every_port_next_to_its_gpus(kind: str, alertname: str) -> None:
    text = f"""
[cluster]
nodes = 3
gpus_per_node = 8
gpu_model = "H100-SXM5-80GB"
seed = 21
start = "2026-01-01T00:00:00Z"
duration = "30m"
step = "10s"

[[jobs]]
id = "train"
user = "alice"
kind = "training"
gpus = ["node-00:0-7", "node-01:0-3"]

[[faults]]
kind = "{kind}"
job = "train"
at = "5m"
duration = "10m"
"""
    outcome = run(text, f"{kind}-by-job")
    assert_clean(outcome)
    ports = {(a.labels["node"], a.labels["device"]) for a in outcome.fired if a.alertname == alertname}
    # the 8 ports of node-00 and the 4 next to GPUs 0-3 of node-01; none of node-02's, none of node-01's others
    assert ports == {("node-00", f"mlx5_{i}") for i in range(8)} | {("node-01", f"mlx5_{i}") for i in range(4)}
    assert {a.labels.get("job") for a in outcome.fired if a.alertname == alertname} == {"train"}


# ------------------------------------------------------------------------------------------------ own scenarios

JOB_CASES = [
    (2, "H100-SXM5-80GB", 1, "pair", "10s"),
    (2, "H200-SXM-141GB", 2, "two-node", "10s"),
    (2, "L40S", 3, "two-node", "10s"),
    (2, "A100-SXM4-80GB", 4, "node", "10s"),
    (2, "H100-SXM5-80GB", 11, "two-node", "30s"),
    (2, "L40S", 12, "pair", "5s"),
    (8, "A100-SXM4-80GB", 5, "wide", "10s"),
    (8, "L40S", 6, "spread", "10s"),
    (8, "H100-SXM5-80GB", 7, "all", "10s"),
    (8, "H200-SXM-141GB", 8, "spread", "15s"),
    (32, "H100-SXM5-80GB", 9, "wide", "10s"),
]


@pytest.mark.parametrize(("nodes", "model", "seed", "topology", "step"), JOB_CASES)
def test_job_faults(nodes: int, model: str, seed: int, topology: str, step: str) -> None:
    text = scenarios.job_faults(nodes, model, seed, topology, step=step)
    outcome = run(text, f"job-{nodes}-{model}-{topology}")
    assert_clean(outcome)
    found = {a.alertname for a in outcome.fired}
    assert {"CommunicationStall", "JobStraggler"} <= found
    assert ("NvlinkBandwidthSaturated" in found) == (model != "L40S" and topology != "spread")
    assert_in_time(outcome, float(step.removesuffix("s")))


HANG_CASES = [
    (2, "H100-SXM5-80GB", 21, "pair", "10s"),
    (2, "L40S", 22, "pair", "5s"),
    (8, "A100-SXM4-80GB", 23, "two-node", "10s"),
    (8, "L40S", 24, "spread", "30s"),
    (8, "H200-SXM-141GB", 25, "node", "15s"),
    (32, "H100-SXM5-80GB", 26, "wide", "10s"),
]


@pytest.mark.parametrize(("nodes", "model", "seed", "topology", "step"), HANG_CASES)
def test_hangs_fire_with_their_signature(nodes: int, model: str, seed: int, topology: str, step: str) -> None:
    outcome = run(scenarios.hangs(nodes, model, seed, topology, step=step), f"hangs-{nodes}-{model}-{topology}")
    assert_clean(outcome)
    assert_in_time(outcome, float(step.removesuffix("s")))
    assert sorted(signatures(outcome)) == [
        ("hang-blocked", "blocked"),
        ("hang-mixed", "mixed"),
        ("hang-spinning", "spinning"),
    ]


@pytest.mark.parametrize(
    ("nodes", "model", "seed", "step"),
    [
        (1, "H100-SXM5-80GB", 31, "10s"),
        (2, "L40S", 32, "30s"),
        (8, "A100-SXM4-80GB", 33, "10s"),
        (8, "H200-SXM-141GB", 34, "15s"),
    ],
)
def test_healthy_phases_raise_nothing(nodes: int, model: str, seed: int, step: str) -> None:
    """Checkpoints of 15 minutes, evaluation phases with little traffic, slow first steps."""
    outcome = run(scenarios.phases(nodes, model, seed, step), f"phases-{nodes}-{model}")
    assert outcome.fired == [], outcome.describe()


@pytest.mark.parametrize(
    ("nodes", "model", "seed"),
    [(2, "H100-SXM5-80GB", 1), (2, "L40S", 2), (8, "A100-SXM4-80GB", 3), (8, "H200-SXM-141GB", 4)],
)
def test_gpu_faults(nodes: int, model: str, seed: int) -> None:
    outcome = run(scenarios.gpu_faults(nodes, model, seed), f"gpu-{nodes}-{model}")
    assert_clean(outcome)
    found = {a.alertname for a in outcome.fired}
    expected = {
        "GpuMemorySaturated",
        "GpuThermalThrottling",
        "GpuPowerCapped",
        "PcieLinkDegraded",
        "PcieBandwidthSaturated",
        "XidError",
        "GpuLost",
        "GpuIdleAllocated",
        "ExporterDown",
        "GpuDriverHung",
        "NvswitchFatalSxid",  # the SXid 24007 is fatal
    }
    assert found == expected | ({"NvlinkErrors"} if model != "L40S" else set())
    xids = sorted(
        (a.labels["node"] + ":" + a.labels["gpu"], a.labels["xid"]) for a in outcome.fired if a.alertname == "XidError"
    )
    n0, n1 = scenarios.node(0, nodes), scenarios.node(1, nodes)
    # XID 79 on a GPU, XID 79 on a GPU lost at once (the kernel log's line), XID 119 from the kernel log alone;
    # XIDs 13 and 31 are application errors
    assert xids == sorted([(f"{n0}:5", "79"), (f"{n0}:7", "79"), (f"{n1}:4", "119")])
    capped = sorted(a.labels["gpu"] for a in outcome.fired if a.alertname == "GpuPowerCapped")
    assert len(capped) == 2  # the inference GPU and the training rank, and no straggler for the rank
    assert "JobStraggler" not in found


@pytest.mark.parametrize(
    ("nodes", "model", "seed", "pcie_node"),
    [
        (2, "L40S", 1, False),
        (8, "H100-SXM5-80GB", 2, True),
        (8, "A100-SXM4-80GB", 3, True),
        (32, "H200-SXM-141GB", 4, True),
    ],
)
def test_confounders_raise_nothing(nodes: int, model: str, seed: int, pcie_node: bool) -> None:
    outcome = run(scenarios.healthy(nodes, model, seed, pcie_node), f"healthy-{nodes}-{model}")
    assert outcome.fired == [], outcome.describe()
    assert outcome.rounds == 270


@pytest.mark.parametrize(
    ("nodes", "model", "seed"),
    [(4, "H100-SXM5-80GB", 51), (4, "L40S", 52), (8, "A100-SXM4-80GB", 53), (3, "H200-SXM-141GB", 54)],
)
def test_hardware_faults(nodes: int, model: str, seed: int) -> None:
    """A missing GPU, a fabric not ready and nvidia_peermem missing raise their alerts on their node, and the
    confounders raise nothing (GpuConfigDrift needs the majority of at least three nodes with RDMA ports)."""
    outcome = run(scenarios.hardware_faults(nodes, model, seed), f"hardware-{nodes}-{model}")
    assert_clean(outcome)
    found = {a.alertname for a in outcome.fired}
    nvswitch = model != "L40S"
    assert found == {"GpuMissing", "GpuConfigDrift"} | ({"GpuFabricNotReady"} if nvswitch else set())
    [missing] = [a for a in outcome.fired if a.alertname == "GpuMissing"]
    assert missing.labels["pci_bus_id"] == "0000:db:00.0"  # GPU 7 of an HGX board
    [drift] = [a for a in outcome.fired if a.alertname == "GpuConfigDrift"]
    assert (drift.labels["setting"], drift.labels["value"], drift.labels["majority"]) == ("nvidia_peermem", "0", "1")


FABRIC_CASES = [
    (4, "H100-SXM5-80GB", 41, "10s", False),
    (4, "A100-SXM4-80GB", 42, "10s", True),
    (4, "L40S", 43, "15s", False),
    (8, "H200-SXM-141GB", 44, "10s", True),
]


@pytest.mark.parametrize(("nodes", "model", "seed", "step", "by_job"), FABRIC_CASES)
def test_fabric_and_host_faults(nodes: int, model: str, seed: int, step: str, by_job: bool) -> None:
    """Each fabric and host fault raises its alert on the right node, port and job; the confounders (a job on one
    node, checkpoints over the fabric, a job that never spans nodes) and the other nodes raise nothing."""
    outcome = run(scenarios.fabric_faults(nodes, model, seed, step, by_job), f"fabric-{nodes}-{model}")
    assert_clean(outcome)
    assert_in_time(outcome, float(step.removesuffix("s")))
    n0, n1, n2, n3 = (scenarios.node(i, nodes) for i in range(4))
    ports = {(a.alertname, a.labels["node"], a.labels["device"]) for a in outcome.fired if "device" in a.labels}
    nic = functools.partial(scenarios.nic_of, model)
    assert (IB_ERRORS, n2, nic(6)) in ports
    assert (IB_LINK_DEGRADED, n3, nic(7)) in ports
    assert (IB_LINK_FLAPPING, n0, nic(5)) in ports
    down = {(n, d) for name, n, d in ports if name == IB_LINK_DOWN}
    congested = {(n, d) for name, n, d in ports if name == FABRIC_CONGESTION}
    per_node = scenarios.NICS_PER_NODE[model]
    if by_job:  # every port next to the job's GPUs
        assert down == {(n, f"mlx5_{i}") for n in (n0, n1) for i in range(per_node)}
        assert congested == {(n, nic(g)) for n in (n2, n3) for g in range(4)}
    else:
        assert down == {(n1, nic(2))}
        assert congested == {(n2, nic(0))}
    inputs = sorted(a.labels["job_id"] for a in outcome.fired if a.alertname == JOB_INPUT_BOUND)
    assert inputs == ["multi", "pair", "solo"]
    [stall] = [a for a in outcome.fired if a.alertname == COMMUNICATION_STALL]
    assert stall.labels["job_id"] == "multi"
    assert stall.muted is None  # a member of the link's incident, which pages; the stall shows, marked with its cause
    assert stall.annotations.get("incident", "").startswith("inc-")
    assert stall.annotations["cause"].startswith(f"{IB_LINK_DOWN} ")
    assert " is down since " in stall.summary
    links = [a for a in outcome.fired if a.alertname == IB_LINK_DOWN]
    assert all(a.labels["job"] == "multi" for a in links)
    assert all(a.labels["gpus"] for a in links)
