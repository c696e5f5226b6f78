"""dcgm-exporter pages as deployments serve them, through both readers over real HTTP: identical records.

Each page under tests/fixtures/dcgm/wild is served by a stand-in dcgm-exporter and read by the exporter's ``dcgm``
source and by the collector's scraper (a ``kind = "dcgm"`` target); both must find every GPU with the right values
and produce the same records (they share one converter, gpulens.dcgmnode).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from gpulens.clock import ManualClock
from gpulens.collector.scrape import Scraper
from gpulens.collector.targets import Target
from gpulens.exporter.dcgmsource import DcgmSource
from gpulens.model import NodeSnapshot, SourceError
from tests.fakes.dcgm_server import stand_in_dcgm_exporter

WILD = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm" / "wild"
NOW = 1_750_000_000.0
MIB = 1024 * 1024

# page -> (node from the page or None, jobs, MIG instances, {gpu index: expected values})
EXPECTED: dict[str, tuple[str | None, list[str], int, dict[int, dict[str, Any]]]] = {
    "dcgm2x_v100.prom": (
        "dgx1-03",
        [],
        0,
        {
            0: {
                "utilization_ratio": 0.88,
                "memory_used_bytes": 30360 * MIB,
                "memory_temperature_celsius": 44.0,
                "power_watts": 231.456,
                "sm_clock_hertz": 1.53e9,
                "pcie_rx_bytes_per_second": 20480 * 1024.0,
                "energy_joules_total": 81234567.89,
                "model": "Tesla V100-SXM2-32GB",
            },
            1: {"utilization_ratio": 0.0, "pcie_replays_total": 3, "nvlink_tx_bytes_per_second": 0.0},
        },
    ),
    "dcgm3x_a100.prom": (
        "infer-a100-01",
        [],
        0,
        {
            0: {
                "utilization_ratio": 0.64,
                "tensor_active_ratio": 0.201,
                "driver_version": "535.104.05",
                "pcie_tx_bytes_per_second": 123456789.0,
            },
            1: {
                "utilization_ratio": 1.0,
                "xid_errors": {31: 1},
                "remapped_rows_correctable": 2,
                "memory_total_bytes": (3010 + 77553) * MIB,
            },
        },
    ),
    "dcgm4x_h100.prom": (
        "hgx-h100-17",
        ["research/gpt-pretrain-worker-3"],
        0,
        {
            0: {
                "utilization_ratio": 0.97,
                "memory_reserved_bytes": 553 * MIB,
                "power_watts": 612.338,
                "pci_bus_id": "00000000:18:00.0",
                "xid_errors": {},
                "nvlink_tx_bytes_per_second": 93.5e9,
            },
            1: {"sm_clock_hertz": 345e6, "memory_total_bytes": (81004 + 2 + 553) * MIB},
        },
    ),
    "dcgm49_dcgm46_h200.prom": (
        "h200-rack4-n2",
        [],
        0,
        {
            0: {
                "utilization_ratio": 0.91,
                "power_watts": 498.117,
                "temperature_celsius": 54.0,
                "power_limit_watts": 700.0,
                "dram_active_ratio": 0.33,
            },
            1: {
                "utilization_ratio": 0.01,
                "xid_errors": {94: 1},
                "nvlink_crc_flit_errors_total": 4,
                "remapped_rows_uncorrectable": 1,
                "pcie_replays_total": 1,
            },
        },
    ),
    "dcgm49_base_units_h100.prom": (
        "hgx-h100-40",
        [],
        0,
        {
            0: {
                "sm_clock_hertz": 1.755e9,
                "memory_clock_hertz": 2.619e9,
                "memory_used_bytes": 80734060544,
                "memory_total_bytes": 4206886912 + 80734060544 + 579862528,
                "energy_joules_total": 98123456.789,
                "utilization_ratio": 0.77,
            }
        },
    ),
    "old_namespace_t4.prom": (
        "edge-t4-09",
        ["vision/detector-7f9c"],
        0,
        {
            0: {
                "utilization_ratio": 0.73,
                "memory_temperature_celsius": None,
                "temperature_celsius": 67.0,
                "memory_used_bytes": 5973 * MIB,
                "memory_clock_hertz": 5e9,
                "model": "Tesla T4",
            }
        },
    ),
    "v1x_p100.prom": (
        None,
        [],
        0,
        {
            0: {
                "utilization_ratio": 1.0,
                "pcie_tx_bytes_per_second": 2048 * 1024.0,
                "memory_used_bytes": 15256 * MIB,
                "model": "unknown",
            },
            1: {"ecc_uncorrected_errors_total": 0, "power_watts": 31.2},
        },
    ),
    "mig_pods_a100.prom": (
        "mig-a100-05",
        ["serving/llama-8b-0", "data-sci/jupyter-ana"],
        2,
        # GR_ENGINE_ACTIVE per instance, weighted by slices: (0.8 * 4 + 0.1 * 3) / 7
        {0: {"utilization_ratio": 0.5, "mig_enabled": True, "temperature_celsius": 48.0, "power_watts": 233.71}},
    ),
    "vgpu_a100d.prom": (
        "vm-train-22",
        [],
        0,
        {
            0: {
                "utilization_ratio": 0.43,
                "memory_temperature_celsius": None,
                "power_watts": None,
                "energy_joules_total": None,
                "model": "GRID A100D-40C",
            }
        },
    ),
    "gddr_localhost.prom": (
        None,  # Hostname="localhost" names no node
        [],
        0,
        {
            0: {"memory_temperature_celsius": None, "model": "Tesla T4", "utilization_ratio": 0.12},
            1: {"memory_temperature_celsius": None, "model": "NVIDIA L4", "temperature_celsius": 66.0},
            2: {"memory_temperature_celsius": None, "model": "NVIDIA L40S", "memory_reserved_bytes": 524 * MIB},
        },
    ),
}


def test_every_wild_page_has_expectations() -> None:
    assert sorted(p.name for p in WILD.glob("*.prom")) == sorted(EXPECTED)


def _read_both(url: str) -> tuple[NodeSnapshot, NodeSnapshot]:
    exported = DcgmSource(url, clock=ManualClock(NOW)).read()
    scraper = Scraper(clock=ManualClock(NOW))
    try:
        result = scraper.scrape(Target(name="target-a", url=url, kind="dcgm"))
    finally:
        scraper.close()
    assert result.health.up, result.health.last_error
    assert result.snapshot is not None
    return exported, result.snapshot


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_wild_page_gives_the_same_records_through_the_exporter_and_the_collector(name: str) -> None:
    page_node, jobs, migs, gpus = EXPECTED[name]
    with stand_in_dcgm_exporter((WILD / name).read_bytes()) as server:
        exported, scraped = _read_both(server.url)

    assert exported.node == (page_node or socket.gethostname())
    assert scraped.node == exported.node  # a loopback URL without a usable label: this machine
    assert exported.gpus == scraped.gpus
    assert [(j.gpu, j.job_id) for j in exported.jobs] == [(j.gpu, j.job_id) for j in scraped.jobs]
    assert [j.job_id for j in scraped.jobs] == jobs
    assert len(exported.migs) == len(scraped.migs) == migs
    assert [g.gpu for g in scraped.gpus] == sorted(gpus)
    for g in scraped.gpus:
        assert g.up
        for key, value in gpus[g.gpu].items():
            actual = getattr(g, key)
            if isinstance(value, float):
                assert actual == pytest.approx(value), (name, g.gpu, key)
            else:
                assert actual == value, (name, g.gpu, key)


def test_pods_on_mig_instances_stay_on_their_instance() -> None:
    with stand_in_dcgm_exporter((WILD / "mig_pods_a100.prom").read_bytes()) as server:
        exported, scraped = _read_both(server.url)
    parent = "GPU-d1e8a4c7-39b2-4f60-8a15-7e2c0b9d6f31"
    expected = [("serving/llama-8b-0", f"MIG-{parent}/1"), ("data-sci/jupyter-ana", f"MIG-{parent}/2")]
    assert [(j.job_id, j.mig_uuid) for j in scraped.jobs] == expected
    assert exported.jobs == scraped.jobs
    assert {m.mig_uuid: m.profile for m in scraped.migs} == {f"MIG-{parent}/1": "4g.40gb", f"MIG-{parent}/2": "3g.40gb"}


def test_a_configured_node_wins_over_the_page_label() -> None:
    with stand_in_dcgm_exporter((WILD / "gddr_localhost.prom").read_bytes()) as server:
        assert DcgmSource(server.url, node="inf-07").read().node == "inf-07"
        scraper = Scraper()
        result = scraper.scrape(Target(name="t", url=server.url, kind="dcgm", node="inf-07"))
        scraper.close()
    assert result.snapshot is not None
    assert result.snapshot.node == "inf-07"
    assert {g.node for g in result.snapshot.gpus} == {"inf-07"}


def test_a_cut_body_is_refused_and_a_cut_last_line_is_dropped_by_both_readers() -> None:
    text = (WILD / "dcgm4x_h100.prom").read_bytes()
    with stand_in_dcgm_exporter(text) as server:
        server.serve(text, cut_to=len(text) // 2)  # the connection drops before Content-Length bytes arrived
        scraper = Scraper()
        cut = scraper.scrape(Target(name="t", url=server.url, kind="dcgm"))
        with pytest.raises(SourceError, match="body is truncated"):
            DcgmSource(server.url).read()
        server.serve(text[: len(text) - 9])  # a complete response whose last line was cut mid-labels
        mid_line = scraper.scrape(Target(name="t", url=server.url, kind="dcgm"))
        exporter = DcgmSource(server.url).read()
        scraper.close()
    assert not cut.health.up
    assert "body is truncated" in (cut.health.last_error or "")
    assert mid_line.health.up  # the lines before the cut one are kept, the cut one is counted
    assert mid_line.rejected["dcgm_truncated"] == 1
    assert exporter.errors["dcgm_truncated"] == 1
    assert mid_line.snapshot is not None
    assert [g.uuid for g in mid_line.snapshot.gpus] == [g.uuid for g in exporter.gpus]
