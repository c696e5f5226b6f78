"""The per-GPU and per-node builtin rules on hand-made rounds, the catalogue, and overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulens.alerts.base import dashboard_path
from gpulens.alerts.catalogue import (
    BUILTIN_NAMES,
    ECC_UNCORRECTABLE,
    EXPORTER_DOWN,
    GPU_LOST,
    HW_POWER_BRAKE,
    IDLE_ALLOCATED,
    MEMORY_SATURATED,
    NVLINK_ERRORS,
    NVLINK_SATURATED,
    PCIE_DEGRADED,
    PCIE_SATURATED,
    POWER_CAPPED,
    THERMAL_THROTTLING,
    XID_ERROR,
)
from gpulens.alerts.cataloguedoc import markdown_table
from gpulens.alerts.rules import builtin_rules, data_missing, evaluate, required_window_s
from gpulens.config import ConfigError
from gpulens.model import GpuReading, TargetHealth

from .support import GIB, Feed, healthy_gpu, rule, snapshot, target, training, uuid

CONTRACT = {
    "HostMemoryPressure",
    "HostCpuContention",
    "GpuMemorySaturated",
    "GpuThermalThrottling",
    "GpuPowerCapped",
    "GpuHwPowerBrake",
    "PcieBandwidthSaturated",
    "NvlinkBandwidthSaturated",
    "PcieLinkDegraded",
    "NvlinkErrors",
    "CommunicationStall",
    "JobStraggler",
    "GpuIdleAllocated",
    "JobInefficient",
    "JobCommunicationSlow",
    "XidError",
    "EccUncorrectable",
    "GpuLost",
    "ExporterDown",
    "IbLinkDown",
    "IbLinkFlapping",
    "IbLinkDegraded",
    "IbErrors",
    "FabricCongestion",
    "FabricBandwidthSaturated",
    "JobInputBound",
    "GpuMissing",
    "IbPortMissing",
    "IbPortSlow",
    "GpuFabricNotReady",
    "GpuConfigDrift",
    "GpuDriverHung",
    "NvswitchFatalSxid",
    "Watchdog",
}


def one(reading: GpuReading, name: str, job: tuple[str, str] | None = None, **thresholds: float):
    """The candidates of rule ``name`` on a single round holding ``reading``."""
    feed = Feed()
    feed.add([snapshot(reading.node, [reading], {reading.gpu: job} if job else None)])
    return feed.candidates([rule(name, **thresholds)])


def series(readings: list[GpuReading], name: str, **thresholds: float):
    feed = Feed()
    for reading in readings:
        feed.add([snapshot(reading.node, [reading])])
    return feed.candidates([rule(name, **thresholds)])


def test_the_catalogue_is_the_contract() -> None:
    assert set(BUILTIN_NAMES) == CONTRACT
    for r in builtin_rules():
        assert r.severity in ("critical", "warning", "info") or (r.name, r.severity) == ("Watchdog", "none")
        assert r.meaning
        assert r.action
        assert r.for_s >= 0


def test_memory_saturated_at_95_percent() -> None:
    [c] = one(healthy_gpu(memory_used_bytes=int(77 * GIB)), MEMORY_SATURATED, ("serve", "svc"))
    assert c.labels == {
        "alertname": MEMORY_SATURATED,
        "severity": "warning",
        "node": "node-00",
        "gpu": "0",
        "uuid": uuid("node-00", 0),
        "job_id": "serve",
        "user": "svc",
    }
    assert c.summary == "GPU node-00:0 (job serve, user svc): memory 96% full (77.0 of 80.0 GiB)"
    assert one(healthy_gpu(memory_used_bytes=int(75 * GIB)), MEMORY_SATURATED) == []


def test_thermal_throttling_by_temperature_or_by_reason() -> None:
    assert len(one(healthy_gpu(temperature_celsius=91.0), THERMAL_THROTTLING)) == 1
    assert len(one(healthy_gpu(throttle_reasons=0x20), THERMAL_THROTTLING)) == 1  # sw_thermal
    assert len(one(healthy_gpu(throttle_reasons=0x40), THERMAL_THROTTLING)) == 1  # hw_thermal
    assert one(healthy_gpu(temperature_celsius=85.0), THERMAL_THROTTLING) == []
    # hw_slowdown that comes with the power brake is the brake's, not heat's
    assert one(healthy_gpu(throttle_reasons=0x88), THERMAL_THROTTLING) == []
    assert len(one(healthy_gpu(throttle_reasons=0x88), HW_POWER_BRAKE)) == 1


def test_power_capped_needs_the_reason_and_the_limit() -> None:
    capped = healthy_gpu(utilization_ratio=0.97, power_watts=349.0, power_limit_watts=350.0, throttle_reasons=0x4)
    [c] = one(capped, POWER_CAPPED)
    assert c.value == 349.0
    assert "350 W power limit" in c.summary
    assert one(healthy_gpu(power_watts=349.0, power_limit_watts=350.0), POWER_CAPPED) == []
    below = healthy_gpu(utilization_ratio=0.97, power_watts=250.0, power_limit_watts=350.0, throttle_reasons=0x4)
    assert one(below, POWER_CAPPED) == []


def test_power_capped_holds_through_a_pause() -> None:
    feed = Feed()
    feed.add([snapshot("node-00", [healthy_gpu(utilization_ratio=0.05, power_watts=120.0, power_limit_watts=350.0)])])
    [c] = evaluate([rule(POWER_CAPPED)], feed.history, feed.now)
    assert c.hold
    assert dict(c.labels) == {"uuid": uuid("node-00", 0)}


def test_pcie_saturation_against_the_max_generation_link() -> None:
    gen5_x16 = 3.938e9 * 16
    [c] = one(healthy_gpu(pcie_tx_bytes_per_second=0.9 * gen5_x16), PCIE_SATURATED)
    assert c.value == pytest.approx(0.9)
    assert "PCIe TX" in c.summary
    assert "Gen5 x16" in c.summary
    assert one(healthy_gpu(pcie_rx_bytes_per_second=0.5 * gen5_x16), PCIE_SATURATED) == []
    assert (
        one(healthy_gpu(pcie_rx_bytes_per_second=0.9 * gen5_x16, pcie_link_generation_max=None), PCIE_SATURATED) == []
    )


def test_nvlink_saturation_from_the_active_links() -> None:
    assert len(one(healthy_gpu(nvlink_rx_bytes_per_second=0.9 * 18 * 25e9), NVLINK_SATURATED)) == 1
    # the same rate on a GPU with 24 active links is below the threshold
    assert one(healthy_gpu(nvlink_rx_bytes_per_second=0.9 * 18 * 25e9, nvlink_links_active=24), NVLINK_SATURATED) == []
    # NVLink 5: 50 GB/s per link
    assert (
        one(healthy_gpu(nvlink_rx_bytes_per_second=0.9 * 18 * 25e9), NVLINK_SATURATED, link_bytes_per_second=50e9) == []
    )
    assert one(healthy_gpu(nvlink_links_active=0, nvlink_rx_bytes_per_second=None), NVLINK_SATURATED) == []


def test_pcie_link_degraded_width_always_generation_only_while_busy() -> None:
    [c] = one(healthy_gpu(pcie_link_width=8), PCIE_DEGRADED)
    assert "x8 instead of x16" in c.summary
    assert c.value == pytest.approx(0.5)
    # an idle GPU that lowered its generation to save power is healthy
    assert one(healthy_gpu(pcie_link_generation=1), PCIE_DEGRADED) == []
    busy = healthy_gpu(pcie_link_generation=3, utilization_ratio=0.9)
    [c] = one(busy, PCIE_DEGRADED)
    assert "Gen3 instead of Gen5 while busy" in c.summary
    traffic = healthy_gpu(pcie_link_generation=3, pcie_rx_bytes_per_second=5e9)  # idle compute, busy link
    assert len(one(traffic, PCIE_DEGRADED)) == 1


def test_pcie_replays_above_the_health_limit() -> None:
    readings = [healthy_gpu(pcie_replays_total=i * 20) for i in range(7)]  # 120 per minute
    [c] = series(readings, PCIE_DEGRADED)
    assert "120 replays/min" in c.summary
    assert series([healthy_gpu(pcie_replays_total=i) for i in range(7)], PCIE_DEGRADED) == []


def test_nvlink_errors_crc_rate_or_any_replay() -> None:
    crc = [healthy_gpu(nvlink_crc_flit_errors_total=i * 2000) for i in range(7)]  # 200/s
    [c] = series(crc, NVLINK_ERRORS)
    assert c.value == pytest.approx(200.0)
    slow_crc = [healthy_gpu(nvlink_crc_flit_errors_total=i * 500) for i in range(7)]  # 50/s
    assert series(slow_crc, NVLINK_ERRORS) == []
    replay = [healthy_gpu(nvlink_replay_errors_total=0)] * 6 + [healthy_gpu(nvlink_replay_errors_total=1)]
    assert len(series(replay, NVLINK_ERRORS)) == 1
    # a counter reset (driver reload) is not an error burst
    reset = [healthy_gpu(nvlink_replay_errors_total=500)] * 6 + [healthy_gpu(nvlink_replay_errors_total=0)]
    assert series(reset, NVLINK_ERRORS) == []


def test_xid_error_for_paging_codes_that_increased() -> None:
    before = healthy_gpu(xid_errors={})
    after = healthy_gpu(xid_errors={79: 1, 13: 4})
    [c] = series([before, after], XID_ERROR)
    assert c.labels["xid"] == "79"
    assert "XID 79 (GPU has fallen off the bus), 1 event in the last 10m" in c.summary
    # an old count seen on the first reading is not an event in the window
    assert series([after], XID_ERROR) == []
    assert series([after, after], XID_ERROR) == []
    # an application XID is not paged on, unless the codes say so
    assert series([before, healthy_gpu(xid_errors={13: 1})], XID_ERROR) == []
    assert len(series([before, healthy_gpu(xid_errors={13: 1})], XID_ERROR, codes=(13.0,))) == 1


def test_xid_error_ends_when_the_event_leaves_the_window() -> None:
    feed = Feed()
    feed.add([snapshot("node-00", [healthy_gpu(xid_errors={})])])
    feed.add([snapshot("node-00", [healthy_gpu(xid_errors={48: 1})])])
    xid = rule(XID_ERROR, window_s=60.0)
    assert len(feed.candidates([xid])) == 1
    for _ in range(6):
        feed.add([snapshot("node-00", [healthy_gpu(xid_errors={48: 1})])])
    assert feed.candidates([xid]) == []


def test_ecc_uncorrectable_increase_or_remap_failure() -> None:
    grew = [healthy_gpu(ecc_uncorrected_errors_total=0), healthy_gpu(ecc_uncorrected_errors_total=2)]
    [c] = series(grew, ECC_UNCORRECTABLE)
    assert c.value == 2.0
    assert len(one(healthy_gpu(remapped_rows_failure=True), ECC_UNCORRECTABLE)) == 1
    assert series([healthy_gpu(ecc_uncorrected_errors_total=3)] * 2, ECC_UNCORRECTABLE) == []


def test_gpu_lost() -> None:
    lost = GpuReading(node="node-00", gpu=3, uuid=uuid("node-00", 3), model="NVIDIA H100", timestamp=0.0, up=False)
    [c] = one(lost, GPU_LOST, ("train", "alice"))
    assert c.labels["gpu"] == "3"
    assert c.labels["job_id"] == "train"
    assert one(lost, MEMORY_SATURATED) == []  # nothing else is judged on a lost GPU


def test_idle_allocated_only_with_a_job() -> None:
    [c] = one(healthy_gpu(utilization_ratio=0.02), IDLE_ALLOCATED, ("forgotten", "dave"))
    assert c.labels["job_id"] == "forgotten"
    assert one(healthy_gpu(utilization_ratio=0.02), IDLE_ALLOCATED) == []  # a free GPU is not waste
    assert one(healthy_gpu(utilization_ratio=0.5), IDLE_ALLOCATED, ("busy", "x")) == []


def test_idle_allocated_says_for_how_long() -> None:
    feed = Feed()
    feed.add([snapshot("node-00", [healthy_gpu(utilization_ratio=0.9)], {0: ("j", "u")})])
    for _ in range(12):
        feed.add([snapshot("node-00", [healthy_gpu(utilization_ratio=0.01)], {0: ("j", "u")})])
    [c] = feed.candidates([rule(IDLE_ALLOCATED)])
    assert c.summary.endswith("1% utilization for 1m50s")


def scrape(up: bool) -> TargetHealth:
    name = "http://scrape:s3cret@node-04:9410"  # a target named by a URL with credentials
    error = None if up else "answered HTTP 503"
    return TargetHealth(name, "http://***@node-04:9410", "gpulens", 0.0, up, node="node-04", last_error=error)


def test_exporter_down_names_the_node_and_hides_credentials() -> None:
    feed = Feed()
    feed.add([], [scrape(True)])
    feed.add([], [scrape(False)])
    feed.add([], [scrape(False)])
    [c] = feed.candidates([rule(EXPORTER_DOWN)])
    assert c.labels["node"] == "node-04"
    assert "s3cret" not in repr(c)
    assert c.summary == "node node-04: exporter not answering for 10s: answered HTTP 503"


def test_data_missing_holds_alerts_of_unanswered_nodes_and_lost_gpus() -> None:
    feed = Feed()
    feed.add([snapshot("node-00", [training("node-00", 0)]), snapshot("node-01", [training("node-01", 0)])])
    lost = GpuReading(node="node-00", gpu=0, uuid=uuid("node-00", 0), model="m", timestamp=0.0, up=False)
    feed.add([snapshot("node-00", [lost])], [target("node-01", up=False)])
    history = feed.history
    assert data_missing(history, MEMORY_SATURATED, {"node": "node-01", "gpu": "0"})
    assert not data_missing(history, EXPORTER_DOWN, {"node": "node-01"})
    assert data_missing(history, MEMORY_SATURATED, {"node": "node-00", "uuid": uuid("node-00", 0)})
    assert not data_missing(history, GPU_LOST, {"node": "node-00", "uuid": uuid("node-00", 0)})
    assert data_missing(history, GPU_LOST, {"node": "node-01", "uuid": uuid("node-01", 0)})


def test_dashboard_paths() -> None:
    assert dashboard_path({"job_id": "llm/pretrain", "uuid": "GPU-1"}, "job") == "/jobs/llm%2Fpretrain"
    assert dashboard_path({"job_id": "j", "uuid": "GPU-1", "node": "n"}, "gpu") == "/gpus/GPU-1"
    assert dashboard_path({"node": "node-01"}, "node") == "/nodes/node-01"
    assert dashboard_path({"job_id": "a,b"}, "job") is None


def test_overrides_change_thresholds_for_severity_and_labels() -> None:
    rules = {
        r.name: r
        for r in builtin_rules(
            {
                MEMORY_SATURATED: {"used_ratio": 0.97, "for": "10m", "severity": "critical", "labels": {"team": "ml"}},
                XID_ERROR: {"codes": [13, 79], "window_s": "5m"},
                HW_POWER_BRAKE: {"enabled": False},
            }
        )
    }
    memory = rules[MEMORY_SATURATED]
    assert (memory.threshold("used_ratio"), memory.for_s, memory.severity) == (0.97, 600.0, "critical")
    assert memory.labels == {"team": "ml"}
    assert rules[XID_ERROR].codes("codes") == {13, 79}
    assert rules[XID_ERROR].threshold("window_s") == 300.0
    assert HW_POWER_BRAKE not in rules
    assert required_window_s(list(rules.values())) == 1800.0


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"NoSuchRule": {}}, "alerts.builtin.NoSuchRule"),
        ({MEMORY_SATURATED: {"used_ration": 0.9}}, "alerts.builtin.GpuMemorySaturated.used_ration"),
        ({MEMORY_SATURATED: {"for": "soon"}}, "alerts.builtin.GpuMemorySaturated.for"),
        ({MEMORY_SATURATED: {"severity": "page"}}, "alerts.builtin.GpuMemorySaturated.severity"),
        ({MEMORY_SATURATED: {"used_ratio": "high"}}, "alerts.builtin.GpuMemorySaturated.used_ratio"),
        ({XID_ERROR: {"codes": ["79"]}}, "alerts.builtin.XidError.codes"),
        ({MEMORY_SATURATED: {"labels": {"alertname": "x"}}}, "alerts.builtin.GpuMemorySaturated.labels"),
    ],
)
def test_bad_overrides_name_their_key(overrides: dict, key: str) -> None:
    with pytest.raises(ConfigError) as err:
        builtin_rules(overrides)
    assert err.value.key == key


def test_docs_catalogue_is_the_catalogue() -> None:
    """docs/alerts.md's table is the catalogue's own (``cataloguedoc.markdown_table``: severity, for,
    keep_firing_for, thresholds, where each rule runs), and every rule has its section (the node and hardware
    rules in docs/alerts-node.md, the host's in docs/alerts-host.md, the Inspector's in docs/nccl-inspector.md)."""
    docs = Path(__file__).resolve().parents[2] / "docs"
    text = (docs / "alerts.md").read_text()
    assert markdown_table(builtin_rules()) in text, "paste `gpulens rules list --markdown` into docs/alerts.md"
    sections = text + "".join((docs / f).read_text() for f in ("alerts-node.md", "alerts-host.md", "nccl-inspector.md"))
    for name in BUILTIN_NAMES:
        assert f"### {name}" in sections
