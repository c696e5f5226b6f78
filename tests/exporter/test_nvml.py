"""NvmlSource against a fake pynvml (real pynvml errors and structs), and against the real library where it loads."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

import pynvml
import pytest

from gpulens.clock import ManualClock
from gpulens.exporter.nvml import LINK_STATE_REFRESH_S, SLOW_REFRESH_S, NvmlSource
from gpulens.model import THROTTLE_MASK, SourceError
from tests.fakes.fake_nvml import GIB, MIB, FakeNvml, h100_gpu, l40s_gpu

MakeSource = Callable[..., NvmlSource]


@pytest.fixture
def make_source() -> Iterator[MakeSource]:
    """Builds NvmlSources on a fake, sharing its clock; closes them after the test."""
    sources: list[NvmlSource] = []

    def make(fake: FakeNvml, **kwargs: object) -> NvmlSource:
        source = NvmlSource("node-a", nvml=fake, clock=fake.clock, **kwargs)  # type: ignore[arg-type]
        sources.append(source)
        return source

    yield make
    for source in sources:
        source.close()


def _clock(fake: FakeNvml) -> ManualClock:
    assert isinstance(fake.clock, ManualClock)
    return fake.clock


def _eventually(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll ``predicate`` until it holds; the timeout only stops a broken test from hanging."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def _nvml_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("gpulens-nvml")]


# --- a healthy node --------------------------------------------------------------------------------------------------


def test_h100_node_fields_are_converted_to_gpulens_units(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=8)
    source = make_source(fake)
    source.read()
    _clock(fake).advance(10)
    snapshot = source.read()

    assert (snapshot.node, snapshot.source, snapshot.driver_version) == ("node-a", "nvml", "550.54.15")
    assert snapshot.timestamp == fake.clock.now()
    assert [g.gpu for g in snapshot.gpus] == list(range(8))
    assert len({g.uuid for g in snapshot.gpus}) == 8
    assert all(g.up and g.timestamp == snapshot.timestamp for g in snapshot.gpus)
    assert snapshot.errors == {}

    gpu = snapshot.gpus[0]
    spec = fake.gpus[0]
    assert (gpu.uuid, gpu.model, gpu.pci_bus_id) == (spec.uuid, "NVIDIA H100 80GB HBM3", "00000000:18:00.0")
    assert gpu.driver_version == "550.54.15"
    assert gpu.mig_enabled is False
    assert gpu.utilization_ratio == pytest.approx(0.97)
    assert gpu.memory_total_bytes == 81559 * MIB
    assert gpu.memory_used_bytes == 70 * GIB
    assert gpu.memory_reserved_bytes == 530 * MIB
    assert gpu.temperature_celsius == 61.0
    assert gpu.memory_temperature_celsius == 70.0
    assert gpu.slowdown_temperature_celsius == 87.0
    assert gpu.power_watts == pytest.approx(612.5)
    assert gpu.power_limit_watts == pytest.approx(700.0)
    # 12.5 MJ at the start, plus 612.5 W for 10 s
    assert gpu.energy_joules_total == pytest.approx(12_500_000 + 6125)
    assert gpu.sm_clock_hertz == pytest.approx(1.98e9)
    assert gpu.memory_clock_hertz == pytest.approx(2.619e9)
    assert gpu.max_sm_clock_hertz == pytest.approx(1.98e9)
    assert gpu.max_memory_clock_hertz == pytest.approx(2.619e9)
    assert gpu.throttle_reasons == 0x4
    assert gpu.pcie_tx_bytes_per_second == pytest.approx(1_200_000 * 1024)
    assert gpu.pcie_rx_bytes_per_second == pytest.approx(2_400_000 * 1024)
    assert (gpu.pcie_link_generation, gpu.pcie_link_generation_max) == (5, 5)
    assert (gpu.pcie_link_width, gpu.pcie_link_width_max) == (16, 16)
    assert gpu.pcie_replays_total == 2
    assert gpu.nvlink_links_active == 18
    assert gpu.nvlink_tx_bytes_per_second == pytest.approx(18 * 10 * GIB)
    assert gpu.nvlink_rx_bytes_per_second == pytest.approx(18 * 9 * GIB)
    assert (gpu.nvlink_crc_flit_errors_total, gpu.nvlink_replay_errors_total) == (3, 1)
    assert gpu.nvlink_recovery_errors_total == 0
    assert (gpu.ecc_corrected_errors_total, gpu.ecc_uncorrected_errors_total) == (5, 0)
    assert (gpu.remapped_rows_correctable, gpu.remapped_rows_uncorrectable) == (1, 0)
    assert (gpu.remapped_rows_pending, gpu.remapped_rows_failure) == (False, False)
    assert gpu.xid_errors == {}
    # DCGM-only profiling fields are not NVML's to fill.
    assert (gpu.sm_active_ratio, gpu.tensor_active_ratio, gpu.dram_active_ratio) == (None, None, None)

    assert len(snapshot.links) == 8 * 18
    link = next(k for k in snapshot.links if (k.gpu, k.link) == (0, 4))
    assert (link.uuid, link.active, link.remote_pci_bus_id) == (spec.uuid, True, "00000000:05:00.0")
    assert link.tx_bytes_per_second == pytest.approx(10 * GIB)
    assert link.rx_bytes_per_second == pytest.approx(9 * GIB)
    assert [(p.gpu, p.pid, p.memory_used_bytes) for p in snapshot.processes] == [
        (i, 4000 + i, 70 * GIB) for i in range(8)
    ]
    assert snapshot.migs == ()


def test_static_facts_are_read_once_and_dynamic_values_every_read(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=2)
    source = make_source(fake)
    for _ in range(3):
        source.read()
    assert fake.calls["nvmlDeviceGetUUID"] == 2
    assert fake.calls["nvmlDeviceGetMaxClockInfo"] == 2 * 2
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 3 * 2
    assert fake.calls["nvmlDeviceGetFieldValues"] == 3 * 2  # one batched call per GPU and read


def test_pcie_only_gpu_has_no_nvlink_values(make_source: MakeSource) -> None:
    fake = FakeNvml([l40s_gpu(0)])
    snapshot = make_source(fake).read()
    gpu = snapshot.gpus[0]
    assert gpu.model == "NVIDIA L40S"
    assert gpu.nvlink_links_active is None
    assert (gpu.nvlink_tx_bytes_per_second, gpu.nvlink_crc_flit_errors_total) == (None, None)
    assert snapshot.links == ()
    assert gpu.mig_enabled is None  # the L40S has no MIG: NotSupported means unknown, not "off"
    assert gpu.memory_temperature_celsius == 45.0
    assert gpu.pcie_link_generation == 4


# --- NVLink rates from cumulative counters ---------------------------------------------------------------------------


def test_nvlink_rate_is_delta_bytes_over_delta_seconds(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=8)
    fake.gpus[0].nvlink_inactive = {17}
    source = make_source(fake)
    clock = _clock(fake)

    first = source.read()
    assert all(g.nvlink_tx_bytes_per_second is None for g in first.gpus)
    assert all(k.tx_bytes_per_second is None for k in first.links)

    clock.advance(5)
    second = source.read()
    assert second.gpus[1].nvlink_tx_bytes_per_second == pytest.approx(18 * 10 * GIB)
    assert second.gpus[0].nvlink_tx_bytes_per_second == pytest.approx(17 * 10 * GIB)
    assert second.gpus[0].nvlink_links_active == 17
    idle = next(k for k in second.links if (k.gpu, k.link) == (0, 17))
    assert (idle.active, idle.tx_bytes_per_second) == (False, 0.0)

    fake.gpus[1].nvlink_tx_kib_per_s = 1024  # traffic drops to 1 MiB/s per link
    clock.advance(2)
    third = source.read()
    assert third.gpus[1].nvlink_tx_bytes_per_second == pytest.approx(18 * 1024 * 1024)


def test_link_states_are_cached_for_the_refresh_interval(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=1)
    source = make_source(fake)
    clock = _clock(fake)
    source.read()
    calls = fake.calls["nvmlDeviceGetNvLinkState"]
    clock.advance(1)
    fake.gpus[0].nvlink_inactive = {4}
    cached = source.read()
    assert fake.calls["nvmlDeviceGetNvLinkState"] == calls  # no state calls within the interval
    assert cached.gpus[0].nvlink_links_active == 18
    clock.advance(LINK_STATE_REFRESH_S)
    fresh = source.read()
    assert fake.calls["nvmlDeviceGetNvLinkState"] == calls + 18
    assert fresh.gpus[0].nvlink_links_active == 17
    assert [k.link for k in fresh.links if not k.active] == [4]


def test_nvlink_counter_going_backwards_restarts_the_rate(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=8)
    source = make_source(fake)
    clock = _clock(fake)
    source.read()
    clock.advance(10)
    source.read()
    fake.reset_counters(2)
    clock.advance(1)

    after_reset = source.read()
    assert after_reset.gpus[2].nvlink_tx_bytes_per_second is None
    assert all(k.tx_bytes_per_second is None for k in after_reset.links if k.gpu == 2)
    assert after_reset.gpus[3].nvlink_tx_bytes_per_second == pytest.approx(18 * 10 * GIB)

    clock.advance(4)
    again = source.read()
    assert again.gpus[2].nvlink_rx_bytes_per_second == pytest.approx(18 * 9 * GIB)


def test_nvlink_total_falls_back_to_the_sum_of_links(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=1)
    fake.gpus[0].nvlink_aggregate = False  # an older driver: no all-links scope
    source = make_source(fake)
    source.read()
    _clock(fake).advance(10)
    snapshot = source.read()
    gpu = snapshot.gpus[0]
    assert gpu.nvlink_tx_bytes_per_second == pytest.approx(18 * 10 * GIB)
    assert gpu.nvlink_rx_bytes_per_second == pytest.approx(18 * 9 * GIB)
    assert snapshot.errors == {}  # a refused all-links scope is an expected answer, with the per-link sum instead


# --- failures mapped to meanings -------------------------------------------------------------------------------------


def test_gpu_lost_mid_run_is_reported_down_while_the_others_are_read(
    make_source: MakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml.h100_node(gpus=8)
    source = make_source(fake)
    assert all(g.up for g in source.read().gpus)

    fake.lose(5)
    with caplog.at_level(logging.WARNING, logger="gpulens.exporter"):
        lost = source.read()
    down = lost.gpus[5]
    assert down.up is False
    assert (down.uuid, down.model, down.pci_bus_id) == (fake.gpus[5].uuid, "NVIDIA H100 80GB HBM3", "00000000:AB:00.0")
    assert down.driver_version == "550.54.15"
    assert down.memory_used_bytes is None
    assert down.power_watts is None
    assert down.utilization_ratio is None
    assert down.nvlink_links_active is None
    assert all(g.up and g.power_watts == pytest.approx(612.5) for g in lost.gpus if g.gpu != 5)
    assert not [k for k in lost.links if k.gpu == 5]
    assert not [p for p in lost.processes if p.gpu == 5]
    assert lost.errors["nvml_gpu_lost"] == 1
    assert len([r for r in caplog.records if "is lost" in r.getMessage()]) == 1

    # Once lost, NVML may answer Unknown: that still means lost, not a new kind of error.
    fake.lose(5, pynvml.NVML_ERROR_UNKNOWN)
    still = source.read()
    assert still.gpus[5].up is False
    assert still.errors["nvml_gpu_lost"] == 2
    assert "nvml_error" not in still.errors
    assert len([r for r in caplog.records if "is lost" in r.getMessage()]) == 1

    fake.restore(5)
    back = source.read()
    assert back.gpus[5].up is True
    assert back.gpus[5].memory_used_bytes == 70 * GIB

    # Back to health, an Unknown error is an ordinary failure again.
    fake.fail(5, "nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_UNKNOWN)
    later = source.read()
    assert later.gpus[5].up is True
    assert later.gpus[5].power_watts is None
    assert later.errors["nvml_error"] == 1
    assert later.errors["nvml_gpu_lost"] == 2


def test_unknown_error_on_a_healthy_gpu_is_counted_not_lost(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=2)
    fake.fail(1, "nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_UNKNOWN)
    snapshot = make_source(fake).read()
    assert snapshot.gpus[1].up is True
    assert snapshot.gpus[1].power_watts is None
    assert snapshot.gpus[1].temperature_celsius == 61.0
    assert snapshot.errors == {"nvml_error": 1}


def test_gpu_lost_before_start_up_is_not_monitored(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=4)
    fake.lose(2)
    snapshot = make_source(fake).read()
    assert [g.gpu for g in snapshot.gpus] == [0, 1, 3]
    assert snapshot.errors["nvml_gpu_lost"] == 1


def test_not_supported_values_are_none_and_counted(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=8)
    fake.fail(0, "nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.fail(0, "nvmlDeviceGetRemappedRows", pynvml.NVML_ERROR_NOT_SUPPORTED)
    fake.fail_field(0, pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_ERROR_NOT_SUPPORTED)
    source = make_source(fake)

    snapshot = source.read()
    gpu = snapshot.gpus[0]
    assert gpu.up is True
    assert (gpu.power_watts, gpu.memory_temperature_celsius) == (None, None)
    assert (gpu.remapped_rows_correctable, gpu.remapped_rows_pending) == (None, None)
    assert gpu.power_limit_watts == pytest.approx(700.0)
    assert gpu.nvlink_crc_flit_errors_total == 3  # the rest of the batched fields still count
    assert snapshot.gpus[1].power_watts == pytest.approx(612.5)
    assert snapshot.gpus[1].memory_temperature_celsius == 70.0
    assert snapshot.errors == {"nvml_not_supported": 3}
    # The power and the memory temperature are asked again on every read; the remapped rows, which change rarely,
    # once SLOW_REFRESH_S has passed.
    assert source.read().errors == {"nvml_not_supported": 5}
    _clock(fake).advance(SLOW_REFRESH_S)
    assert source.read().errors == {"nvml_not_supported": 8}


def test_old_driver_falls_back_to_older_calls_and_skips_missing_ones(
    make_source: MakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml.h100_node(gpus=8)
    for symbol in (
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetTemperatureV",
        "nvmlDeviceGetComputeRunningProcesses_v3",
    ):
        fake.remove_function(symbol)
    source = make_source(fake)

    with caplog.at_level(logging.WARNING, logger="gpulens.exporter"):
        first = source.read()
        calls_after_first = fake.calls["nvmlDeviceGetCurrentClocksEventReasons"]
        second = source.read()

    gpu = second.gpus[4]
    assert gpu.throttle_reasons == 0x4  # from nvmlDeviceGetCurrentClocksThrottleReasons
    assert gpu.throttle_reasons & ~THROTTLE_MASK == 0
    assert (gpu.memory_used_bytes, gpu.memory_total_bytes, gpu.memory_reserved_bytes) == (70 * GIB, 81559 * MIB, None)
    assert gpu.temperature_celsius == 61.0
    assert [(p.gpu, p.pid) for p in second.processes] == [(i, 4000 + i) for i in range(8)]
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 16
    assert 1 <= calls_after_first <= 8  # GPUs read in parallel may all try it once
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == calls_after_first  # not called again
    assert second.errors["nvml_function_not_found"] == first.errors["nvml_function_not_found"]
    messages = [r.getMessage() for r in caplog.records]
    assert len([m for m in messages if "nvmlDeviceGetCurrentClocksEventReasons" in m]) == 1
    assert len([m for m in messages if "nvmlDeviceGetComputeRunningProcesses " in m]) == 1


def test_missing_function_without_fallback_is_none(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=2)
    fake.remove_function("nvmlDeviceGetRemappedRows")
    source = make_source(fake)
    source.read()
    snapshot = source.read()
    assert snapshot.gpus[0].remapped_rows_failure is None
    assert snapshot.gpus[0].ecc_corrected_errors_total == 5
    assert 1 <= fake.calls["nvmlDeviceGetRemappedRows"] <= 2


def test_no_permission_is_none_and_logged_once(make_source: MakeSource, caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeNvml.h100_node(gpus=8)
    for index in range(8):
        fake.fail(index, "nvmlDeviceGetComputeRunningProcesses", pynvml.NVML_ERROR_NO_PERMISSION)
    source = make_source(fake)
    with caplog.at_level(logging.WARNING, logger="gpulens.exporter"):
        source.read()
        snapshot = source.read()
    assert snapshot.processes == ()
    assert all(g.up and g.memory_used_bytes == 70 * GIB for g in snapshot.gpus)
    assert snapshot.errors == {"nvml_no_permission": 16}
    assert len([r for r in caplog.records if "no permission" in r.getMessage()]) == 1


# --- MIG, processes, XIDs ------------------------------------------------------------------------------------------


def test_mig_enabled_gpu_has_mig_devices_and_no_utilization(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=8)
    fake.enable_mig(3, devices=2)
    snapshot = make_source(fake).read()

    gpu = snapshot.gpus[3]
    assert gpu.mig_enabled is True
    assert gpu.utilization_ratio is None
    assert gpu.memory_used_bytes == 70 * GIB
    assert snapshot.gpus[2].mig_enabled is False
    assert snapshot.gpus[2].utilization_ratio == pytest.approx(0.97)
    assert fake.calls_by_gpu[("nvmlDeviceGetUtilizationRates", 3)] == 0
    assert "nvml_not_supported" not in snapshot.errors  # empty MIG slots answer NotFound: expected, not counted

    migs = sorted(snapshot.migs, key=lambda m: m.gpu_instance_id)
    assert [(m.gpu, m.uuid) for m in migs] == [(3, fake.gpus[3].uuid)] * 2
    assert [m.mig_uuid for m in migs] == [mig.uuid for mig in fake.gpus[3].migs]
    assert [(m.gpu_instance_id, m.compute_instance_id, m.profile) for m in migs] == [
        (9, 0, "1g.10gb"),
        (10, 0, "1g.10gb"),
    ]
    assert [(m.memory_used_bytes, m.memory_total_bytes) for m in migs] == [(GIB, 9984 * MIB), (2 * GIB, 9984 * MIB)]


def test_mig_layout_is_enumerated_every_slow_refresh_and_memory_on_every_read(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=1)
    fake.enable_mig(0, devices=2)
    clock = _clock(fake)
    source = make_source(fake)
    source.read()
    enumerated = fake.calls["nvmlDeviceGetMigDeviceHandleByIndex"]
    assert enumerated == 7  # every slot once

    fake.gpus[0].migs[0].memory_used = 3 * GIB
    clock.advance(1)
    migs = sorted(source.read().migs, key=lambda m: m.gpu_instance_id)
    assert [m.memory_used_bytes for m in migs] == [3 * GIB, 2 * GIB]  # memory: read every time
    assert fake.calls["nvmlDeviceGetMigDeviceHandleByIndex"] == enumerated  # the layout: reused

    fake.enable_mig(0, devices=3)  # reconfigured by an administrator
    clock.advance(SLOW_REFRESH_S)
    assert len(source.read().migs) == 3
    assert fake.calls["nvmlDeviceGetMigDeviceHandleByIndex"] == 2 * enumerated


def test_mig_layout_is_enumerated_again_at_once_when_a_device_memory_fails(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=1)
    fake.enable_mig(0, devices=2)
    clock = _clock(fake)
    source = make_source(fake)
    source.read()
    enumerated = fake.calls["nvmlDeviceGetMigDeviceHandleByIndex"]
    fake.fail(0, "nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_NOT_FOUND)
    clock.advance(1)
    migs = source.read().migs
    assert [m.memory_used_bytes for m in migs] == [None, None]  # still reported, as before the layout was cached
    assert fake.calls["nvmlDeviceGetMigDeviceHandleByIndex"] == 2 * enumerated


def test_values_that_change_rarely_are_read_every_slow_refresh(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=2)
    clock = _clock(fake)
    source = make_source(fake)
    source.read()
    fake.change(0, ecc_corrected=9, power_limit_mw=500_000, pcie_replays=7, remapped_rows=(2, 0, 1, 0), power_mw=1000)
    clock.advance(1)
    gpu = source.read().gpus[0]
    assert gpu.power_watts == pytest.approx(1.0)  # dynamic: read every time
    assert (gpu.ecc_corrected_errors_total, gpu.pcie_replays_total, gpu.remapped_rows_pending) == (5, 2, False)
    assert gpu.power_limit_watts == pytest.approx(700.0)
    for function in ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetRemappedRows"):
        assert fake.calls[function] == 2  # once per GPU
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 2 * 2  # corrected and uncorrected
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 2 * 2

    clock.advance(SLOW_REFRESH_S)
    gpu = source.read().gpus[0]
    assert (gpu.ecc_corrected_errors_total, gpu.pcie_replays_total) == (9, 7)
    assert (gpu.remapped_rows_correctable, gpu.remapped_rows_pending) == (2, True)
    assert gpu.power_limit_watts == pytest.approx(500.0)
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 2 * 2 * 2


def test_compute_processes_by_pid_with_unknown_memory_as_none(make_source: MakeSource) -> None:
    fake = FakeNvml([h100_gpu(0), h100_gpu(1)])
    fake.gpus[1].processes = [(1234, GIB), (1235, None)]
    fake.gpus[0].processes = []
    snapshot = make_source(fake).read()
    assert [(p.gpu, p.uuid, p.pid, p.memory_used_bytes) for p in snapshot.processes] == [
        (1, fake.gpus[1].uuid, 1234, GIB),
        (1, fake.gpus[1].uuid, 1235, None),
    ]
    assert all((p.command, p.user, p.job_id) == (None, None, None) for p in snapshot.processes)


def test_xid_events_are_counted_per_gpu_and_code(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=8)
    source = make_source(fake)
    for index, code in ((1, 79), (1, 48), (1, 79), (6, 94)):
        fake.xid(index, code)

    def delivered() -> bool:
        gpus = source.read().gpus
        return gpus[1].xid_errors == {79: 2, 48: 1} and gpus[6].xid_errors == {94: 1}

    assert _eventually(delivered)
    snapshot = source.read()
    assert all(g.xid_errors == {} for g in snapshot.gpus if g.gpu not in (1, 6))
    assert "nvml_error" not in snapshot.errors  # wait timeouts are the normal answer

    fake.lose(1)  # a lost GPU keeps its XID counts: XID 79 is how it usually goes
    assert source.read().gpus[1].xid_errors == {79: 2, 48: 1}


def test_xid_events_unsupported_are_counted_and_the_rest_carries_on(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=4)
    fake.fail(0, "nvmlDeviceRegisterEvents", pynvml.NVML_ERROR_NOT_SUPPORTED)
    source = make_source(fake)
    fake.xid(0, 79)  # GPU 0 is not registered: no event
    fake.xid(2, 31)
    assert _eventually(lambda: source.read().gpus[2].xid_errors == {31: 1})
    snapshot = source.read()
    assert snapshot.gpus[0].xid_errors == {}
    assert snapshot.errors == {"xid_events_unsupported": 1}


def test_no_xid_thread_when_no_gpu_supports_events(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=2)
    for index in range(2):
        fake.fail(index, "nvmlDeviceRegisterEvents", pynvml.NVML_ERROR_NOT_SUPPORTED)
    source = make_source(fake)
    assert "gpulens-nvml-xid" not in _nvml_threads()
    assert fake.event_sets_freed == 1
    assert source.read().errors == {"xid_events_unsupported": 2}


# --- concurrency and lifecycle ---------------------------------------------------------------------------------------


def test_gpus_and_pcie_directions_are_read_in_parallel(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=8, pcie_latency_s=0.02)
    snapshot = make_source(fake).read()
    assert all(g.pcie_tx_bytes_per_second is not None for g in snapshot.gpus)
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 16
    # Serial reading would never have two 20 ms PCIe samples in flight at once.
    assert fake.max_concurrent("nvmlDeviceGetPcieThroughput") > 1
    assert max(fake.max_concurrent("nvmlDeviceGetPcieThroughput", gpu=i) for i in range(8)) == 2


def test_max_workers_one_still_reads_every_gpu(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=3)
    snapshot = make_source(fake, max_workers=1).read()
    assert [g.gpu for g in snapshot.gpus] == [0, 1, 2]
    with pytest.raises(ValueError, match="max_workers"):
        NvmlSource("node-a", nvml=fake, max_workers=0)


def test_close_stops_the_xid_thread_and_the_pools() -> None:
    fake = FakeNvml.h100_node(gpus=8)
    source = NvmlSource("node-a", nvml=fake, clock=fake.clock)
    source.read()
    threads = _nvml_threads()
    assert "gpulens-nvml-xid" in threads
    assert any(name.startswith("gpulens-nvml_") for name in threads)

    source.close()
    assert _nvml_threads() == []
    assert (fake.shutdown_calls, fake.event_sets_freed, fake.initialized) == (1, 1, False)
    source.close()
    assert fake.shutdown_calls == 1
    with pytest.raises(SourceError, match="closed"):
        source.read()


def test_without_xid_events_no_event_set_is_made(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=2)
    make_source(fake, xid_events=False).read()
    assert fake.calls["nvmlEventSetCreate"] == 0
    assert "gpulens-nvml-xid" not in _nvml_threads()


# --- start-up failures -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "problem"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML library not found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "no permission"),
        (pynvml.NVML_ERROR_UNKNOWN, "NVML could not start: Unknown Error"),
    ],
)
def test_init_failure_is_a_source_error_with_a_hint(code: int, problem: str) -> None:
    fake = FakeNvml.h100_node(gpus=1, init_error=code)
    with pytest.raises(SourceError) as info:
        NvmlSource("node-a", nvml=fake)
    message = str(info.value)
    assert problem in message
    assert "--source sim" in message
    assert "--source dcgm" in message
    assert "\n" not in message
    assert isinstance(info.value.__cause__, pynvml.NVMLError)


def test_failure_to_count_gpus_shuts_nvml_down() -> None:
    fake = FakeNvml.h100_node(gpus=1)
    fake.remove_function("nvmlDeviceGetCount_v2")
    with pytest.raises(SourceError, match="count the GPUs"):
        NvmlSource("node-a", nvml=fake)
    assert (fake.shutdown_calls, fake.initialized) == (1, False)


def _real_nvml_init_error() -> pynvml.NVMLError | None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return exc
    pynvml.nvmlShutdown()
    return None


def test_real_pynvml_without_a_driver_gives_a_clear_start_up_error() -> None:
    """On machines without NVML (this one raises LibraryNotFound) the real module yields a SourceError with a hint."""
    error = _real_nvml_init_error()
    if error is None:  # a GPU machine: the same call must succeed instead
        NvmlSource("real", xid_events=False).close()
        return
    with pytest.raises(SourceError) as info:
        NvmlSource("real")
    assert "--source sim" in str(info.value)
    if isinstance(error, pynvml.NVMLError_LibraryNotFound):
        assert str(info.value).startswith("NVML library not found")


# --- the real library, where it loads --------------------------------------------------------------------------------


@pytest.fixture
def real_gpu_count() -> int:
    error = _real_nvml_init_error()
    if error is not None:
        pytest.skip(f"NVML cannot start on this machine: {error}")
    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


@pytest.mark.gpu
def test_real_gpus_are_read_in_gpulens_units(real_gpu_count: int) -> None:
    source = NvmlSource("real")
    try:
        first = source.read()
        time.sleep(0.5)
        second = source.read()
    finally:
        source.close()
    assert len(second.gpus) == real_gpu_count
    assert second.driver_version
    for before, gpu in zip(first.gpus, second.gpus, strict=True):
        assert gpu.up
        assert gpu.uuid.startswith("GPU-")
        assert gpu.memory_total_bytes is not None
        assert gpu.memory_total_bytes > GIB
        assert gpu.memory_used_bytes is not None
        assert 0 <= gpu.memory_used_bytes <= gpu.memory_total_bytes
        assert gpu.temperature_celsius is not None
        assert 0 < gpu.temperature_celsius < 130
        assert gpu.power_watts is not None
        assert 0 < gpu.power_watts < 2000
        assert gpu.sm_clock_hertz is not None
        assert gpu.sm_clock_hertz >= 1e7
        assert gpu.throttle_reasons is not None
        assert gpu.pcie_link_width_max is not None
        assert 1 <= gpu.pcie_link_width_max <= 32
        if gpu.utilization_ratio is not None:
            assert 0 <= gpu.utilization_ratio <= 1
        if before.energy_joules_total is not None and gpu.energy_joules_total is not None:
            assert gpu.energy_joules_total >= before.energy_joules_total
        if gpu.nvlink_links_active:
            assert gpu.nvlink_tx_bytes_per_second is not None
            assert gpu.nvlink_tx_bytes_per_second >= 0


@pytest.mark.gpu
def test_real_source_closes_its_threads(real_gpu_count: int) -> None:
    source = NvmlSource("real")
    assert len(source.read().gpus) == real_gpu_count
    source.close()
    assert _nvml_threads() == []


def test_video_encoder_and_decoder_utilization_are_ratios(make_source: MakeSource) -> None:
    fake = FakeNvml.h100_node(gpus=2)
    fake.gpus[0].encoder_utilization = 37
    fake.gpus[1].decoder_utilization = 5
    gpus = make_source(fake).read().gpus
    assert (gpus[0].encoder_utilization_ratio, gpus[0].decoder_utilization_ratio) == (0.37, 0.0)
    assert (gpus[1].encoder_utilization_ratio, gpus[1].decoder_utilization_ratio) == (0.0, 0.05)
