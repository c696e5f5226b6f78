"""GPM in the NVML source (against the fake's GPM, built on pynvml's own structs), and NVLink error totals summed
over links where the driver refuses the all-links fields."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Iterator

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.clock import ManualClock
from gpulens.exporter.metrics import ExporterHealth, render_metrics
from gpulens.exporter.nvml import LINK_STATE_REFRESH_S, NvmlSource
from tests.fakes.fake_nvml import GIB, MIB, FakeNvml, h100_gpu, h200_gpu, l40s_gpu

MakeSource = Callable[..., NvmlSource]
PCIE_THROUGHPUT = "nvmlDeviceGetPcieThroughput"
GPM_EVERYTHING = {"pcie": "gpm", "nvlink": "gpm", "profiling": "gpm"}
OLD_WAYS = {"pcie": "sample", "nvlink": "counters"}


@pytest.fixture
def make_source() -> Iterator[MakeSource]:
    sources: list[NvmlSource] = []

    def make(fake: FakeNvml, **kwargs: object) -> NvmlSource:
        source = NvmlSource("node-a", nvml=fake, clock=fake.clock, xid_events=False, **kwargs)  # type: ignore[arg-type]
        sources.append(source)
        return source

    yield make
    for source in sources:
        source.close()


def _advance(fake: FakeNvml, seconds: float) -> None:
    assert isinstance(fake.clock, ManualClock)
    fake.clock.advance(seconds)


# --- GPM-capable GPUs ------------------------------------------------------------------------------------------------


def test_gpm_gives_averages_over_the_interval_between_collections(make_source: MakeSource) -> None:
    fake = FakeNvml.h200_node(gpus=2)
    source = make_source(fake)
    first = source.read()
    # The first collection after start has no interval to average over.
    gpu = first.gpus[0]
    assert (gpu.pcie_tx_bytes_per_second, gpu.pcie_rx_bytes_per_second) == (None, None)
    assert (gpu.sm_active_ratio, gpu.tensor_active_ratio, gpu.dram_active_ratio) == (None, None, None)
    assert gpu.nvlink_tx_bytes_per_second is None
    assert first.metric_sources[gpu.uuid] == GPM_EVERYTHING

    _advance(fake, 1)
    fake.change(0, pcie_tx_kbs=3 * 8960 * 1024, gpm_sm_util=0.0)  # a burst, and idle SMs, for half the interval
    _advance(fake, 1)
    second = source.read()
    gpu = second.gpus[0]
    assert gpu.pcie_tx_bytes_per_second == pytest.approx((8960 + 3 * 8960) / 2 * MIB)  # the average, not the burst
    assert gpu.pcie_rx_bytes_per_second == pytest.approx(8518 * MIB)
    assert gpu.sm_active_ratio == pytest.approx(0.958 / 2)
    assert gpu.tensor_active_ratio == pytest.approx(0.930)
    assert gpu.dram_active_ratio == pytest.approx(0.178)
    assert gpu.nvlink_tx_bytes_per_second == pytest.approx(18 * 10 * GIB)
    assert gpu.nvlink_rx_bytes_per_second == pytest.approx(18 * 9 * GIB)
    links = [link for link in second.links if link.gpu == 0]
    assert len(links) == 18
    assert all(link.tx_bytes_per_second == pytest.approx(10 * GIB) for link in links)
    assert all(link.rx_bytes_per_second == pytest.approx(9 * GIB) for link in links)
    assert second.gpus[1].sm_active_ratio == pytest.approx(0.958)
    assert second.errors == {}
    # GPM replaces the blocking 20 ms PCIe sample entirely.
    assert fake.calls[PCIE_THROUGHPUT] == 0
    assert fake.calls["nvmlGpmSampleGet"] == 4
    assert fake.calls["nvmlGpmMetricsGet"] == 2


def test_an_idle_gpu_reads_zero_not_absent(make_source: MakeSource) -> None:
    gpu = h200_gpu(0)
    gpu.pcie_tx_kbs = gpu.pcie_rx_kbs = 0
    gpu.gpm_sm_util = gpu.gpm_tensor_util = gpu.gpm_dram_util = 0.0
    gpu.nvlink_tx_kib_per_s = gpu.nvlink_rx_kib_per_s = 0.0
    fake = FakeNvml([gpu])
    source = make_source(fake)
    source.read()
    _advance(fake, 1)
    reading = source.read().gpus[0]
    assert (reading.pcie_tx_bytes_per_second, reading.sm_active_ratio, reading.dram_active_ratio) == (0.0, 0.0, 0.0)
    assert reading.nvlink_tx_bytes_per_second == 0.0


def test_gpm_unsupported_gpus_fall_back_to_the_20ms_sample(make_source: MakeSource) -> None:
    fake = FakeNvml([h200_gpu(0), l40s_gpu(1), h100_gpu(2)])  # the H100 stands for a driver without GPM support
    source = make_source(fake)
    snapshot = source.read()
    h200, l40s, h100 = snapshot.gpus
    assert l40s.pcie_tx_bytes_per_second == pytest.approx(0)  # the L40S's preset: no PCIe traffic
    assert h100.pcie_tx_bytes_per_second == pytest.approx(1_200_000 * 1024)  # on the first read already
    assert h100.sm_active_ratio is None
    assert snapshot.metric_sources == {h200.uuid: GPM_EVERYTHING, l40s.uuid: {"pcie": "sample"}, h100.uuid: OLD_WAYS}
    assert (fake.calls_by_gpu[(PCIE_THROUGHPUT, 0)], fake.calls_by_gpu[(PCIE_THROUGHPUT, 1)]) == (0, 2)
    assert fake.calls_by_gpu[("nvmlGpmSampleGet", 1)] == 0
    assert fake.gpm.allocated == 2  # two samples for the one GPU that has GPM
    assert snapshot.errors == {"nvml_not_supported": 1}  # the L40S's MIG mode, not GPM


def test_a_mig_enabled_gpu_is_not_read_through_gpm(make_source: MakeSource) -> None:
    fake = FakeNvml.h200_node(gpus=1)
    fake.enable_mig(0, devices=2)
    snapshot = make_source(fake).read()
    assert snapshot.metric_sources[snapshot.gpus[0].uuid] == OLD_WAYS
    assert fake.gpm.allocated == 0


def test_a_driver_without_gpm_is_mapped_once_and_falls_back(
    make_source: MakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml.h200_node(gpus=4)
    fake.remove_function("nvmlGpmQueryDeviceSupport")
    with caplog.at_level(logging.WARNING):
        source = make_source(fake)
        source.read()
        _advance(fake, 1)
        snapshot = source.read()
    assert all(snapshot.metric_sources[g.uuid] == OLD_WAYS for g in snapshot.gpus)
    assert all(g.pcie_tx_bytes_per_second == pytest.approx(8960 * MIB) for g in snapshot.gpus)
    assert snapshot.errors == {"nvml_function_not_found": 1}
    assert fake.calls["nvmlGpmQueryDeviceSupport"] == 1  # missing once: never asked again
    assert sum("nvmlGpmQueryDeviceSupport" in r.getMessage() for r in caplog.records) == 1


def test_a_gpu_that_refuses_gpm_at_run_time_falls_back_in_the_same_read(make_source: MakeSource) -> None:
    fake = FakeNvml.h200_node(gpus=2)
    source = make_source(fake)
    source.read()
    _advance(fake, 1)
    fake.fail(0, "nvmlGpmSampleGet", pynvml.NVML_ERROR_NOT_SUPPORTED)
    snapshot = source.read()
    gpu = snapshot.gpus[0]
    assert snapshot.metric_sources[gpu.uuid] == OLD_WAYS
    assert gpu.pcie_tx_bytes_per_second == pytest.approx(8960 * MIB)  # from the 20 ms sample, in the same read
    assert gpu.sm_active_ratio is None
    assert snapshot.metric_sources[snapshot.gpus[1].uuid] == GPM_EVERYTHING  # the other GPU keeps GPM
    assert snapshot.gpus[1].sm_active_ratio == pytest.approx(0.958)
    assert fake.gpm.freed == 2  # GPU 0's two samples
    _advance(fake, 1)
    later = source.read()
    assert later.gpus[0].nvlink_tx_bytes_per_second == pytest.approx(18 * 10 * GIB)  # the field counters took over
    assert fake.calls_by_gpu[("nvmlGpmSampleGet", 0)] == 2  # not asked again once refused
    assert later.errors == {"nvml_not_supported": 1}


def test_a_driver_without_the_gpm_sample_call_falls_back_on_every_gpu(make_source: MakeSource) -> None:
    fake = FakeNvml.h200_node(gpus=4)
    source = make_source(fake)
    source.read()
    fake.remove_function("nvmlGpmSampleGet")  # as pynvml raises it: NVMLError_FunctionNotFound
    _advance(fake, 1)
    snapshot = source.read()
    assert all(snapshot.metric_sources[g.uuid] == OLD_WAYS for g in snapshot.gpus)
    assert all(g.pcie_rx_bytes_per_second == pytest.approx(8518 * MIB) for g in snapshot.gpus)
    assert (fake.gpm.allocated, fake.gpm.freed) == (8, 8)
    assert snapshot.errors == {"nvml_function_not_found": 1}
    assert fake.calls["nvmlGpmSampleGet"] == 4 + 1  # the first read, then one call that found it missing


def test_a_metric_that_answers_not_supported_hands_only_its_quantity_back(make_source: MakeSource) -> None:
    fake = FakeNvml.h200_node(gpus=1)
    fake.gpus[0].gpm_unsupported_metrics = {pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC}
    source = make_source(fake)
    source.read()
    _advance(fake, 1)
    snapshot = source.read()
    gpu = snapshot.gpus[0]
    assert snapshot.metric_sources[gpu.uuid] == {"pcie": "sample", "nvlink": "gpm", "profiling": "gpm"}
    assert gpu.pcie_tx_bytes_per_second == pytest.approx(8960 * MIB)
    assert gpu.sm_active_ratio == pytest.approx(0.958)
    assert snapshot.errors == {"nvml_not_supported": 1}
    _advance(fake, 1)
    third = source.read()
    assert fake.calls_by_gpu[(PCIE_THROUGHPUT, 0)] == 4  # both directions, in each read after the refusal
    assert third.gpus[0].tensor_active_ratio == pytest.approx(0.930)
    assert third.errors == {"nvml_not_supported": 1}  # the refused metric is no longer asked for


def test_a_failed_sample_costs_one_interval(make_source: MakeSource) -> None:
    fake = FakeNvml.h200_node(gpus=1)
    source = make_source(fake)
    source.read()
    fake.fail(0, "nvmlGpmSampleGet", pynvml.NVML_ERROR_UNKNOWN)
    _advance(fake, 1)
    assert source.read().gpus[0].pcie_tx_bytes_per_second is None
    del fake.gpus[0].failures["nvmlGpmSampleGet"]
    _advance(fake, 1)
    assert source.read().gpus[0].pcie_tx_bytes_per_second is None  # no previous sample to average from
    _advance(fake, 1)
    snapshot = source.read()
    assert snapshot.gpus[0].pcie_tx_bytes_per_second == pytest.approx(8960 * MIB)
    assert snapshot.metric_sources[snapshot.gpus[0].uuid] == GPM_EVERYTHING  # a passing failure keeps GPM
    assert snapshot.errors == {"nvml_error": 1}


def test_a_lost_gpu_starts_its_gpm_interval_again(make_source: MakeSource) -> None:
    fake = FakeNvml.h200_node(gpus=2)
    source = make_source(fake)
    source.read()
    fake.lose(0)
    _advance(fake, 1)
    assert source.read().gpus[0].up is False
    fake.restore(0)
    _advance(fake, 1)
    back = source.read().gpus[0]
    assert back.up
    assert back.pcie_tx_bytes_per_second is None  # an interval across the loss is not averaged over
    _advance(fake, 1)
    assert source.read().gpus[0].pcie_tx_bytes_per_second == pytest.approx(8960 * MIB)


def test_close_frees_every_gpm_sample() -> None:
    fake = FakeNvml.h200_node(gpus=8)
    source = NvmlSource("node-a", nvml=fake, clock=fake.clock, xid_events=False)
    source.read()
    source.close()
    assert (fake.gpm.allocated, fake.gpm.freed, fake.gpm.live) == (16, 16, {})


# --- the source label ------------------------------------------------------------------------------------------------


def test_metric_sources_are_exported_and_promtool_accepts_them(make_source: MakeSource, promtool: str) -> None:
    fake = FakeNvml([h200_gpu(0), h100_gpu(1), l40s_gpu(2)])
    source = make_source(fake)
    source.read()
    _advance(fake, 1)
    body = render_metrics(source.read(), ExporterHealth())
    families = {f.name: f.samples for f in text_string_to_metric_families(body.decode())}
    found = {
        (s.labels["gpu"], s.labels["quantity"], s.labels["source"]) for s in families["gpulens_gpu_metric_source_info"]
    }
    assert found == {
        ("0", "pcie", "gpm"),
        ("0", "nvlink", "gpm"),
        ("0", "profiling", "gpm"),
        ("1", "pcie", "sample"),
        ("1", "nvlink", "counters"),
        ("2", "pcie", "sample"),
    }
    assert all({"node", "uuid", "model"} <= set(s.labels) for s in families["gpulens_gpu_metric_source_info"])
    assert {s.labels["gpu"] for s in families["gpulens_gpu_sm_active_ratio"]} == {"0"}
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


# --- NVLink error totals ---------------------------------------------------------------------------------------------


def test_nvlink_errors_are_summed_over_links_where_the_totals_are_refused(make_source: MakeSource) -> None:
    fake = FakeNvml.h200_node(gpus=2)
    refusing = fake.gpus[0]
    refusing.nvlink_error_totals = False
    refusing.nvlink_crc_flit_errors, refusing.nvlink_replay_errors, refusing.nvlink_recovery_errors = 40, 1, 0
    source = make_source(fake)
    first = source.read()
    gpu = first.gpus[0]
    assert (gpu.nvlink_crc_flit_errors_total, gpu.nvlink_replay_errors_total) == (40, 1)
    assert gpu.nvlink_recovery_errors_total == 0
    assert (first.gpus[1].nvlink_crc_flit_errors_total, first.gpus[1].nvlink_replay_errors_total) == (3, 1)
    assert fake.calls_by_gpu[("nvmlDeviceGetNvLinkErrorCounter", 0)] == 3 * 18
    assert fake.calls_by_gpu[("nvmlDeviceGetNvLinkErrorCounter", 1)] == 0
    assert first.errors == {"nvml_not_supported": 3}  # each refused total, once

    refusing.nvlink_crc_flit_errors = 45
    _advance(fake, 1)
    cached = source.read()
    assert cached.gpus[0].nvlink_crc_flit_errors_total == 40  # the per-link sums are refreshed every 10 s
    assert fake.calls_by_gpu[("nvmlDeviceGetNvLinkErrorCounter", 0)] == 3 * 18
    _advance(fake, LINK_STATE_REFRESH_S)
    fresh = source.read()
    assert fresh.gpus[0].nvlink_crc_flit_errors_total == 45
    assert fresh.errors == {"nvml_not_supported": 3}  # the refused totals are no longer asked for


def test_a_failing_link_counter_gives_no_total_rather_than_a_dip(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=1)
    fake.gpus[0].nvlink_error_totals = False
    fake.fail(0, "nvmlDeviceGetNvLinkErrorCounter", pynvml.NVML_ERROR_UNKNOWN)
    gpu = make_source(fake).read().gpus[0]
    assert (gpu.nvlink_crc_flit_errors_total, gpu.nvlink_replay_errors_total) == (None, None)
