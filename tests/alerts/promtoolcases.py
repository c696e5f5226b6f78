"""The cases of ``test_promtool_rule_cases``: for every exported alerting rule, input series (one sample a minute)
that fire it and series that must not, with the evaluation time and the alerts expected then."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpulens.hardware import pcie_max_bytes_per_second

Series = tuple[str, Mapping[str, str], str]  # (family, labels, promtool values)

GPU: Final = {"node": "n1", "gpu": "0", "uuid": "GPU-0", "model": "H100"}
PLACE: Final = {"node": "n1", "gpu": "0", "uuid": "GPU-0"}
PORT: Final = {"node": "n1", "device": "mlx5_0", "port": "1"}
MINUTES: Final = 90  # samples per series, one a minute
COMM: Final = {"job_id": "train", "comm": "0x5f1e22c7a90b4d", "collective": "AllReduce", "size": "256MiB"}


def gpu(i: int) -> dict[str, str]:
    return {**GPU, "gpu": str(i), "uuid": f"GPU-{i}"}


def steady(value: float | str, n: int = MINUTES) -> str:
    return " ".join([str(value)] * n)


def then(*parts: tuple[float | str, int]) -> str:
    """Values in runs: ``then((0, 10), (1, 20))`` is ten 0s then twenty 1s (``"_"``: no sample)."""
    return " ".join(str(v) for v, n in parts for _ in range(n))


def rising(start: int) -> str:
    """A counter at 0 until minute ``start``, then one more each minute."""
    return " ".join(str(max(0, k - start + 1)) for k in range(MINUTES))


def up(*gpus: Mapping[str, str]) -> list[Series]:
    return [("gpulens_gpu_up", g, steady(1)) for g in gpus]


def reason(name: str, value: float, g: Mapping[str, str] = GPU) -> Series:
    return ("gpulens_gpu_throttle_active", {**g, "reason": name, "source": "reported"}, steady(value))


def pcie_link(gen: int, width: int, util: float, traffic: float) -> list[Series]:
    return [
        ("gpulens_gpu_pcie_link_generation", {**GPU, "state": "current"}, steady(gen)),
        ("gpulens_gpu_pcie_link_generation", {**GPU, "state": "max"}, steady(5)),
        ("gpulens_gpu_pcie_link_width", {**GPU, "state": "current"}, steady(width)),
        ("gpulens_gpu_pcie_link_width", {**GPU, "state": "max"}, steady(16)),
        ("gpulens_gpu_utilization_ratio", GPU, steady(util)),
        ("gpulens_gpu_pcie_throughput_bytes_per_second", {**GPU, "direction": "tx"}, steady(traffic)),
        ("gpulens_gpu_pcie_replays_total", GPU, steady(0)),
        *up(GPU),
    ]


def job(gpus: Sequence[Mapping[str, str]], job_id: str = "train", user: str = "alice") -> list[Series]:
    place = [{k: g[k] for k in ("node", "gpu", "uuid")} for g in gpus]
    return [("gpulens_gpu_job_info", {**p, "job_id": job_id, "user": user}, steady(1)) for p in place]


def stalled(utils: Sequence[float], busy_minutes: int = 5, traffic_after: float = 0.0) -> list[Series]:
    """A two-GPU job moving 5 GB/s per GPU over NVLink for ``busy_minutes``, then ``traffic_after``; memory held."""
    gpus = [gpu(i) for i in range(len(utils))]
    out = job(gpus)
    for g, util in zip(gpus, utils, strict=True):
        nvlink = then((5e9, busy_minutes), (traffic_after, MINUTES - busy_minutes))
        out += [
            ("gpulens_gpu_utilization_ratio", g, steady(util)),
            ("gpulens_gpu_nvlink_throughput_bytes_per_second", {**g, "direction": "tx"}, nvlink),
            ("gpulens_gpu_pcie_throughput_bytes_per_second", {**g, "direction": "tx"}, steady(0)),
            ("gpulens_gpu_memory_used_bytes", g, steady(70e9)),
            *up(g),
        ]
    return out


def ranks(state: str, lag: int = 0, age: float | None = None, *, busy: bool = False) -> list[Series]:
    """Two ranks of job ``train`` on GPUs 0 and 1; rank 1 ``state`` (``ok``, ``unresponsive``, ``dead``) and
    ``lag`` operations behind, ``busy`` copying to the host (a checkpoint writer); the communicator's mismatch
    ``age`` (None: its counts agree)."""
    where = {"node": "n1", "job_id": "train", "comm": "c0ffee"}
    out = [
        *job([gpu(0), gpu(1)]),
        ("gpulens_nccl_rank_lag", {**where, "rank": "0"}, steady(0)),
        ("gpulens_nccl_rank_unresponsive", {**where, "rank": "0"}, steady(0)),
        ("gpulens_nccl_rank_dead", {**where, "rank": "0"}, steady(0)),
        ("gpulens_nccl_rank_unresponsive", {**where, "rank": "1"}, steady(int(state != "ok"))),
        ("gpulens_nccl_rank_dead", {**where, "rank": "1"}, steady(int(state == "dead"))),
    ]
    if state == "ok":
        out.append(("gpulens_nccl_rank_lag", {**where, "rank": "1"}, steady(lag)))
        if lag:
            out.append(("gpulens_nccl_rank_busy", {**where, "rank": "1"}, steady(int(busy))))
    if age is not None:
        out.append(("gpulens_nccl_mismatch_age_seconds", where, " ".join(str(age + 60 * k) for k in range(MINUTES))))
    return out


def straggler(clock: float) -> list[Series]:
    """A four-GPU job, GPU 3 at ``clock`` (its peers at 1.98 GHz) drawing less than its waiting peers, whose power
    fell from 700 W to 400 W."""
    gpus = [gpu(i) for i in range(4)]
    out = job(gpus)
    for g in gpus:
        slow = g["gpu"] == "3"
        out += [
            ("gpulens_gpu_clock_hertz", {**g, "clock": "sm"}, steady(clock if slow else 1.98e9)),
            ("gpulens_gpu_utilization_ratio", g, steady(0.97)),
            ("gpulens_gpu_power_watts", g, then((700, 10), (300 if slow else 400, MINUTES - 10))),
            *up(g),
        ]
    return out


def nic(**families: str) -> list[Series]:
    info = ("gpulens_nic_info", {**PORT, "link_layer": "InfiniBand", "gpus": "0-1", "pci_bus_id": "0000:17:00.0"})
    return [(*info, steady(1)), *((f"gpulens_nic_{name}", PORT, values) for name, values in families.items())]


SPEED: Final = 50e9
PCIE_MAX: Final = pcie_max_bytes_per_second(5, 16) or 0.0


@dataclass(frozen=True)
class Case:
    """Input series, an evaluation time (minutes) and the alerts of ``rule`` expected then (their labels less
    ``alertname`` and ``severity``; the rule's severity and static labels are added)."""

    rule: str
    what: str
    series: list[Series]
    at: int
    alerts: list[dict[str, str]]


def _cases() -> list[Case]:
    stall = {"job_id": "train", "user": "alice"}
    thermal = [("gpulens_gpu_temperature_celsius", {**GPU, "sensor": "gpu"}, steady(60))]
    thermal.append(("gpulens_gpu_slowdown_temperature_celsius", GPU, steady(90)))
    power = [("gpulens_gpu_power_limit_watts", GPU, steady(700)), reason("sw_power_cap", 1), *up(GPU)]
    nvlink = [("gpulens_gpu_nvlink_links_active", GPU, steady(18)), *up(GPU)]
    nvlink_rate = 0.85 * 25e9 * 18
    xid = {**GPU, "xid": "48"}
    flow = {"transmit_bytes_total": " ".join(str(1e9 * 60 * k) for k in range(MINUTES))}
    wait_calm = " ".join(str(6e6 * k) for k in range(MINUTES))
    wait_congested = " ".join(str(6e6 * k if k <= 70 else 6e6 * 70 + 1.2e9 * (k - 70)) for k in range(MINUTES))
    saturated = " ".join(str(0.95 * SPEED * 60 * k) for k in range(MINUTES))
    half = " ".join(str(0.5 * SPEED * 60 * k) for k in range(MINUTES))
    speed = {"link_speed_bytes_per_second": steady(SPEED), "up": steady(1)}
    return [
        Case(
            "GpuMemorySaturated",
            "98% full",
            [
                ("gpulens_gpu_memory_used_bytes", GPU, steady(80e9)),
                ("gpulens_gpu_memory_total_bytes", GPU, steady(81.5e9)),
                *up(GPU),
            ],
            10,
            [GPU],
        ),
        Case(
            "GpuMemorySaturated",
            "60% full",
            [
                ("gpulens_gpu_memory_used_bytes", GPU, steady(50e9)),
                ("gpulens_gpu_memory_total_bytes", GPU, steady(81.5e9)),
                *up(GPU),
            ],
            10,
            [],
        ),
        Case(
            "GpuThermalThrottling",
            "hw_slowdown alone",
            [*thermal, reason("hw_slowdown", 1), reason("hw_power_brake", 0)],
            10,
            [GPU],
        ),
        Case(
            "GpuThermalThrottling",
            "hw_slowdown with the power brake (GpuHwPowerBrake's)",
            [*thermal, reason("hw_slowdown", 1), reason("hw_power_brake", 1)],
            10,
            [],
        ),
        Case(
            "GpuThermalThrottling",
            "at its slowdown temperature",
            [("gpulens_gpu_temperature_celsius", {**GPU, "sensor": "gpu"}, steady(91)), thermal[1]],
            10,
            [GPU],
        ),
        Case(
            "GpuPowerCapped",
            "at its cap, a one-minute pause in the work at 11m",
            [
                *power,
                ("gpulens_gpu_power_watts", GPU, then((690, 11), (300, 1), (690, MINUTES - 12))),
                ("gpulens_gpu_utilization_ratio", GPU, then((0.98, 11), (0.05, 1), (0.98, MINUTES - 12))),
            ],
            15,
            [GPU],
        ),
        Case(
            "GpuPowerCapped",
            "below its cap",
            [
                *power,
                ("gpulens_gpu_power_watts", GPU, steady(500)),
                ("gpulens_gpu_utilization_ratio", GPU, steady(0.98)),
            ],
            15,
            [],
        ),
        Case("GpuHwPowerBrake", "power brake set", [reason("hw_power_brake", 1)], 10, [GPU]),
        Case("GpuHwPowerBrake", "power brake clear", [reason("hw_power_brake", 0)], 10, []),
        Case("PcieBandwidthSaturated", "95% of Gen5 x16", [*pcie_link(5, 16, 0.9, 0.95 * PCIE_MAX)], 10, [GPU]),
        Case("PcieBandwidthSaturated", "half of Gen5 x16", [*pcie_link(5, 16, 0.9, 0.5 * PCIE_MAX)], 10, []),
        Case(
            "NvlinkBandwidthSaturated",
            "at 85% of 18 links",
            [
                *nvlink,
                ("gpulens_gpu_nvlink_throughput_bytes_per_second", {**GPU, "direction": "rx"}, steady(nvlink_rate)),
            ],
            10,
            [GPU],
        ),
        Case(
            "NvlinkBandwidthSaturated",
            "at 40% of 18 links",
            [
                *nvlink,
                (
                    "gpulens_gpu_nvlink_throughput_bytes_per_second",
                    {**GPU, "direction": "rx"},
                    steady(0.4 * nvlink_rate),
                ),
            ],
            10,
            [],
        ),
        Case("PcieLinkDegraded", "x8 of x16 on an idle GPU", pcie_link(5, 8, 0.0, 0.0), 10, [GPU]),
        Case("PcieLinkDegraded", "Gen4 of Gen5 on a busy GPU", pcie_link(4, 16, 0.9, 0.0), 10, [GPU]),
        Case("PcieLinkDegraded", "Gen1 of Gen5 on an idle GPU (saving power)", pcie_link(1, 16, 0.0, 0.0), 10, []),
        Case(
            "NvlinkErrors",
            "replay errors from 10m",
            [*nvlink, ("gpulens_gpu_nvlink_errors_total", {**GPU, "type": "replay"}, rising(10))],
            12,
            [GPU],
        ),
        Case(
            "NvlinkErrors",
            "counters at 0 from the first scrape",
            [*nvlink, ("gpulens_gpu_nvlink_errors_total", {**GPU, "type": "replay"}, steady(0))],
            12,
            [],
        ),
        Case(
            "XidError",
            "XID 48's series begins with its first event at 12m",
            [*up(GPU), ("gpulens_gpu_xid_errors_total", xid, then(("_", 12), (1, MINUTES - 12)))],
            13,
            [xid],
        ),
        Case(
            "XidError",
            "XID 48 counted before the first scrape",
            [*up(GPU), ("gpulens_gpu_xid_errors_total", xid, steady(1))],
            5,
            [],
        ),
        Case(
            "XidError",
            "XID 13 (not a paging code)",
            [*up(GPU), ("gpulens_gpu_xid_errors_total", {**GPU, "xid": "13"}, then(("_", 12), (1, MINUTES - 12)))],
            13,
            [],
        ),
        Case(
            "EccUncorrectable",
            "two errors at 10m",
            [
                *up(GPU),
                ("gpulens_gpu_ecc_errors_total", {**GPU, "type": "uncorrected"}, then((0, 10), (2, MINUTES - 10))),
            ],
            12,
            [GPU],
        ),
        Case(
            "EccUncorrectable",
            "the counter at 0 from the first scrape",
            [
                *up(GPU),
                ("gpulens_gpu_ecc_errors_total", {**GPU, "type": "uncorrected"}, steady(0)),
                ("gpulens_gpu_remapped_rows_failure", GPU, steady(0)),
            ],
            5,
            [],
        ),
        Case("GpuLost", "lost", [("gpulens_gpu_up", GPU, steady(0))], 5, [GPU]),
        Case("GpuLost", "answering", up(GPU), 5, []),
        Case(
            "GpuIdleAllocated",
            "allocated at 1%",
            [*job([GPU]), ("gpulens_gpu_utilization_ratio", GPU, steady(0.01))],
            35,
            [{**PLACE, "job_id": "train", "user": "alice"}],
        ),
        Case("GpuIdleAllocated", "idle, not allocated", [("gpulens_gpu_utilization_ratio", GPU, steady(0.01))], 35, []),
        Case(
            "JobStraggler",
            "one GPU at 60% of its peers' clock",
            straggler(1.2e9),
            20,
            [{**PLACE, "gpu": "3", "uuid": "GPU-3", "job_id": "train", "user": "alice"}],
        ),
        Case("JobStraggler", "every GPU at the same clock", straggler(1.98e9), 20, []),
        Case(
            "CommunicationStall",
            "spinning with no traffic",
            stalled([1.0, 1.0]),
            20,
            [{**stall, "signature": "spinning"}],
        ),
        Case(
            "CommunicationStall",
            "spinning, RAS finds a rank dead (only rank_dead)",
            [*stalled([1.0, 1.0]), *ranks("dead")[2:]],
            20,
            [{**stall, "signature": "rank_dead"}],
        ),
        Case(
            "CommunicationStall",
            "blocked: idle, memory held, no traffic",
            stalled([0.0, 0.0]),
            25,
            [{**stall, "signature": "blocked"}],
        ),
        Case(
            "CommunicationStall",
            "mixed: one GPU spins, one is idle",
            stalled([1.0, 0.0]),
            25,
            [{**stall, "signature": "mixed"}],
        ),
        Case("CommunicationStall", "a busy job with traffic", stalled([1.0, 1.0], traffic_after=5e9), 25, []),
        Case(
            "CommunicationStall",
            "RAS: rank 1 unresponsive",
            ranks("unresponsive"),
            5,
            [{**stall, "signature": "rank_dead"}],
        ),
        Case(
            "CommunicationStall",
            "RAS: rank 1 three collectives behind, same mismatch for a minute",
            ranks("ok", lag=3, age=60),
            5,
            [{**stall, "signature": "rank_missing"}],
        ),
        Case(
            "CommunicationStall",
            "RAS: rank 1 behind for minutes while its GPU copies to the host (a checkpoint writer)",
            ranks("ok", lag=1, age=60, busy=True),
            5,
            [],
        ),
        Case(
            "CommunicationStall",
            "RAS: rank 1 behind copying to the host past checkpoint_max_s (stuck in I/O)",
            ranks("ok", lag=1, age=900, busy=True),
            5,
            [{**stall, "signature": "rank_missing"}],
        ),
        Case(
            "CommunicationStall",
            "RAS: a mismatch 10 s old (a straggler, not a missing rank)",
            [
                *ranks("ok", lag=3),
                ("gpulens_nccl_mismatch_age_seconds", {"node": "n1", "job_id": "train", "comm": "c0ffee"}, steady(10)),
            ],
            5,
            [],
        ),
        Case(
            "ExporterDown",
            "an exporter of job gpulens does not answer",
            [("up", {"job": "gpulens", "instance": "n1:9410"}, steady(0))],
            5,
            [{"job": "gpulens", "instance": "n1:9410"}],
        ),
        Case(
            "ExporterDown",
            "every exporter answers",
            [("up", {"job": "gpulens", "instance": "n1:9410"}, steady(1))],
            5,
            [],
        ),
        Case(
            "GpuMissing",
            "a GPU on the bus the driver never opened, and a node with fewer GPUs than expected",
            [
                ("gpulens_node_gpu_missing", {"node": "n1", "pci_bus_id": "0000:db:00.0"}, steady(1)),
                ("gpulens_node_pci_gpus", {"node": "n2"}, steady(7)),
                ("gpulens_node_gpus_expected", {"node": "n2"}, steady(8)),
            ],
            30,
            [{"node": "n1", "pci_bus_id": "0000:db:00.0"}, {"node": "n2"}],
        ),
        Case(
            "GpuMissing",
            "every GPU on the bus opened, as many as expected",
            [
                ("gpulens_node_gpu_missing", {"node": "n1", "pci_bus_id": "0000:db:00.0"}, steady(0)),
                ("gpulens_node_pci_gpus", {"node": "n2"}, steady(8)),
                ("gpulens_node_gpus_expected", {"node": "n2"}, steady(8)),
            ],
            30,
            [],
        ),
        Case(
            "IbPortMissing",
            "7 InfiniBand ports up where 8 are expected",
            [
                ("gpulens_node_ib_ports_active", {"node": "n1"}, steady(7)),
                ("gpulens_node_ib_ports_expected", {"node": "n1"}, steady(8)),
            ],
            30,
            [{"node": "n1"}],
        ),
        Case(
            "IbPortMissing",
            "8 ports up, 8 expected",
            [
                ("gpulens_node_ib_ports_active", {"node": "n1"}, steady(8)),
                ("gpulens_node_ib_ports_expected", {"node": "n1"}, steady(8)),
            ],
            30,
            [],
        ),
        Case(
            "IbPortSlow",
            "an InfiniBand port up at half the expected rate",
            [
                *nic(up=steady(1), link_speed_bytes_per_second=steady(SPEED / 2)),
                ("gpulens_node_ib_rate_expected_bytes_per_second", {"node": "n1"}, steady(SPEED)),
            ],
            30,
            [{**PORT, "gpus": "0-1"}],
        ),
        Case(
            "IbPortSlow",
            "a port at the expected rate",
            [
                *nic(up=steady(1), link_speed_bytes_per_second=steady(SPEED)),
                ("gpulens_node_ib_rate_expected_bytes_per_second", {"node": "n1"}, steady(SPEED)),
            ],
            30,
            [],
        ),
        Case(
            "GpuFabricNotReady",
            "a GPU not registered with the NVLink fabric, and the fabric manager down",
            [
                ("gpulens_gpu_fabric_ready", GPU, steady(0)),
                ("gpulens_node_fabric_manager_up", {"node": "n1"}, steady(0)),
            ],
            30,
            [GPU, {"node": "n1", "service": "nv-fabricmanager"}],
        ),
        Case(
            "GpuFabricNotReady",
            "the fabric ready and its manager running",
            [
                ("gpulens_gpu_fabric_ready", GPU, steady(1)),
                ("gpulens_node_fabric_manager_up", {"node": "n1"}, steady(1)),
            ],
            30,
            [],
        ),
        Case(
            "NvswitchFatalSxid",
            "a fatal SXid, and a non-fatal one that must not page",
            [
                (
                    "gpulens_nvswitch_sxid_errors_total",
                    {"node": "n1", "pci_bus_id": "0000:05:00.0", "sxid": "24007", "severity": "fatal"},
                    steady(1),
                ),
                (
                    "gpulens_nvswitch_sxid_errors_total",
                    {"node": "n1", "pci_bus_id": "0000:05:00.0", "sxid": "12028", "severity": "non-fatal"},
                    steady(3),
                ),
            ],
            30,
            [{"node": "n1", "pci_bus_id": "0000:05:00.0", "sxid": "24007"}],
        ),
        Case(
            "NvswitchFatalSxid",
            "the switch's counter at zero",
            [
                (
                    "gpulens_nvswitch_sxid_errors_total",
                    {"node": "n1", "pci_bus_id": "0000:05:00.0", "sxid": "24007", "severity": "fatal"},
                    steady(0),
                ),
            ],
            30,
            [],
        ),
        Case(
            "GpuConfigDrift",
            "one node of four without nvidia_peermem",
            [("gpulens_node_peermem_loaded", {"node": f"n{i}"}, steady(0 if i == 4 else 1)) for i in range(1, 5)],
            30,
            [{"node": "n4", "setting": "nvidia_peermem", "value": "0"}],
        ),
        Case(
            "GpuConfigDrift",
            "four nodes alike",
            [("gpulens_node_peermem_loaded", {"node": f"n{i}"}, steady(1)) for i in range(1, 5)],
            30,
            [],
        ),
        Case(
            "GpuDriverHung",
            "an NVML call stops returning at 5m; the exporter answers",
            [
                ("gpulens_node_nvml_hung", {"node": "n1"}, then((0, 5), (1, MINUTES - 5))),
                ("up", {"job": "gpulens", "instance": "n1:9410"}, steady(1)),
            ],
            10,
            [{"node": "n1"}],
        ),
        Case(
            "GpuDriverHung",
            "hung at one evaluation only (shorter than its for), then answering again",
            [("gpulens_node_nvml_hung", {"node": "n1"}, then((0, 5), (1, 1), (0, MINUTES - 6)))],
            10,
            [],
        ),
        Case(
            "IbLinkDown",
            "up, then down at 5m",
            nic(up=then((1, 5), (0, MINUTES - 5)), link_downed_total=then((0, 5), (1, MINUTES - 5))),
            10,
            [{**PORT, "gpus": "0-1"}],
        ),
        Case("IbLinkDown", "never up (not cabled)", nic(up=steady(0), link_downed_total=steady(0)), 10, []),
        Case(
            "IbLinkFlapping",
            "down three times in 15 minutes",
            nic(link_downed_total=then((0, 5), (1, 2), (2, 2), (3, MINUTES - 9))),
            10,
            [PORT],
        ),
        Case("IbLinkFlapping", "down once", nic(link_downed_total=then((0, 5), (1, MINUTES - 5))), 10, []),
        Case(
            "IbLinkDegraded",
            "from 50 to 25 GB/s at 5m",
            nic(up=steady(1), link_speed_bytes_per_second=then((SPEED, 5), (SPEED / 2, MINUTES - 5))),
            10,
            [PORT],
        ),
        Case("IbLinkDegraded", "at its rate", nic(**speed), 10, []),
        Case(
            "IbErrors",
            "5 symbol errors a minute",
            nic(symbol_errors_total=then((0, 5)) + " " + " ".join(str(5 * k) for k in range(MINUTES - 5))),
            15,
            [PORT],
        ),
        Case("IbErrors", "no symbol errors", nic(symbol_errors_total=steady(0)), 15, []),
        Case(
            "FabricCongestion",
            "transmit wait 200 times its usual from 70m",
            nic(**speed, **flow, transmit_wait_total=wait_congested),
            80,
            [PORT],
        ),
        Case(
            "FabricCongestion",
            "transmit wait at its usual",
            nic(**speed, **flow, transmit_wait_total=wait_calm),
            80,
            [],
        ),
        Case(
            "FabricBandwidthSaturated",
            "transmitting at 95% of its rate",
            nic(**speed, transmit_bytes_total=saturated, receive_bytes_total=half),
            15,
            [PORT],
        ),
        Case(
            "FabricBandwidthSaturated",
            "at half its rate",
            nic(**speed, transmit_bytes_total=half, receive_bytes_total=half),
            15,
            [],
        ),
        Case(
            "JobCommunicationSlow",
            "an AllReduce at a third of its bandwidth from 20m, on both nodes",
            [
                ("gpulens_nccl_bus_bandwidth_bytes_per_second", {**COMM, "node": n}, then((45e9, 20), (15e9, 70)))
                for n in ("n1", "n2")
            ],
            30,
            [COMM],
        ),
        Case(
            "JobCommunicationSlow",
            "an AllReduce within 10 % of its best",
            [
                ("gpulens_nccl_bus_bandwidth_bytes_per_second", {**COMM, "node": n}, then((45e9, 20), (41e9, 70)))
                for n in ("n1", "n2")
            ],
            30,
            [],
        ),
        Case("Watchdog", "always", [], 1, [{}]),
        *_host_cases(),
    ]


def _host_cases() -> list[Case]:
    """The node's host: memory nearly all taken from 10m; CPUs saturated; a job's cgroup at its CPU limit."""
    node = {"node": "n1"}
    total = ("gpulens_host_memory_total_bytes", node, steady(2**41))
    cgroup = {"node": "n1", "job_id": "train"}
    limit = ("gpulens_job_cpu_limit_cores", cgroup, steady(16))

    def cpu_seconds(cores: float) -> Series:
        return ("gpulens_job_cpu_seconds_total", cgroup, " ".join(str(cores * 60 * k) for k in range(MINUTES)))

    return [
        Case(
            "HostMemoryPressure",
            "0.5 % available from 10m",
            [total, ("gpulens_host_memory_available_bytes", node, then((2**40, 10), (2**41 * 0.005, MINUTES - 10)))],
            15,
            [node],
        ),
        Case(
            "HostMemoryPressure",
            "20 % available",
            [total, ("gpulens_host_memory_available_bytes", node, steady(2**41 * 0.2))],
            15,
            [],
        ),
        Case("HostCpuContention", "CPUs 98 % busy", [("gpulens_host_cpu_busy_ratio", node, steady(0.98))], 15, [node]),
        Case("HostCpuContention", "a job's cgroup at its 16-core limit", [limit, cpu_seconds(16)], 15, [node]),
        Case(
            "HostCpuContention",
            "CPUs 60 % busy, a job at half its limit",
            [("gpulens_host_cpu_busy_ratio", node, steady(0.6)), limit, cpu_seconds(8)],
            15,
            [],
        ),
    ]


CASES: Final = _cases()
