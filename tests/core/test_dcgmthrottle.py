"""dcgm-exporter's default counters and opt-in fields (gpulens.dcgmexp, gpulens.dcgmthrottle): the 26 default fields
read in both name generations, throttle reasons from clock-event counts, violation counters or inference, each
labelled with its source, and the opt-in fields in gpulens units."""

from __future__ import annotations

import pytest

from gpulens.dcgmnode import DcgmPageReader
from gpulens.dcgmpage import parse_dcgm_metrics
from gpulens.dcgmthrottle import inferred_reasons
from gpulens.model import THROTTLE_INFERRED, THROTTLE_REPORTED, THROTTLE_VIOLATION, GpuReading, throttle_reason_names
from gpulens.snapshotcodec import snapshot_from_bytes, snapshot_to_bytes
from tests.fakes.dcgm_defaults import DEFAULT_FAMILIES, DEFAULT_FIELD_COUNT, Gpu, current_name, default_page
from tests.fakes.dcgm_pages import fixture

T = 1_700_000_000.0
HOT, CAPPED, HEALTHY = Gpu(0, sm_mhz=1395, temp=89, power=521.4), Gpu(1, sm_mhz=1710, temp=71, power=698.2), Gpu(2)


def read(reader: DcgmPageReader, page: str, t: float = T) -> dict[int, GpuReading]:
    return {g.gpu: g for g in reader.read(page, t).snapshot.gpus}


def reasons(g: GpuReading) -> tuple[list[str], str | None]:
    return throttle_reason_names(g.throttle_reasons or 0), g.throttle_reasons_source


def test_the_fixture_is_a_default_counters_page_of_26_fields_without_reasons_or_limits() -> None:
    text = fixture("default_counters_h100.prom")
    assert text == default_page([HOT, CAPPED, HEALTHY])
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    assert len(families) + 1 == DEFAULT_FIELD_COUNT == 26  # and the driver version, a label
    assert all('DCGM_FI_DRIVER_VERSION="570.124.06"' in line for line in text.splitlines() if line[0] != "#")
    parsed = parse_dcgm_metrics(text, node=None, timestamp=T)
    assert parsed.error_counts() == {}
    for g in parsed.gpus:  # what gpulens used to judge throttling by: none of it is there
        assert (g.throttle_reasons, g.power_limit_watts, g.max_sm_clock_hertz, g.slowdown_temperature_celsius) == (
            None,
            None,
            None,
            None,
        )


@pytest.mark.parametrize("current_names", [False, True], ids=["default-names", "dcgm46-names"])
def test_a_default_page_gets_inferred_reasons(current_names: bool) -> None:
    page = default_page([HOT, CAPPED, HEALTHY], current_names=current_names)
    if current_names:  # every name the table knows is written in its 4.6 form
        assert "DCGM_FI_DEV_GPU_UTIL_RATIO{" in page
        assert "DCGM_FI_DEV_GPU_UTIL{" not in page
        assert sum(current_name(n) != n for n, _, _ in DEFAULT_FAMILIES) == 13
    gpus = read(DcgmPageReader("http://127.0.0.1:9400/metrics", node=None, fallback_node="here"), page)
    assert reasons(gpus[0]) == (["sw_thermal"], THROTTLE_INFERRED)
    assert reasons(gpus[1]) == (["sw_power_cap"], THROTTLE_INFERRED)
    assert reasons(gpus[2]) == ([], THROTTLE_INFERRED)
    assert (gpus[0].temperature_celsius, gpus[1].power_watts, gpus[0].sm_clock_hertz) == (89.0, 698.2, 1.395e9)


def test_inference_needs_a_maximum_clock_and_a_busy_gpu() -> None:
    base = GpuReading("n", 0, "GPU-x", "NVIDIA H100 80GB HBM3", T, sm_clock_hertz=1.2e9, temperature_celsius=89.0)
    assert inferred_reasons(base) == 0x20  # the model's maximum (1980 MHz) and slowdown temperature (90 C)
    assert inferred_reasons(GpuReading("n", 0, "GPU-x", "Tesla K80", T, sm_clock_hertz=1.2e9)) is None
    unknown_model = GpuReading("n", 0, "GPU-x", "Tesla K80", T, sm_clock_hertz=1.2e9, max_sm_clock_hertz=1.5e9)
    assert inferred_reasons(unknown_model) == 0  # slow, but no limit to say why
    idle = GpuReading(**{**_fields(base), "utilization_ratio": 0.0})
    assert inferred_reasons(idle) == 0  # an idle GPU lowers its clocks of its own accord
    assert inferred_reasons(GpuReading("n", 0, "GPU-x", "NVIDIA H100 80GB HBM3", T)) is None  # no clock at all


def _fields(g: GpuReading) -> dict[str, object]:
    return {name: getattr(g, name) for name in g.__dataclass_fields__}


def _violations(gpu: int, power_ns: int, thermal_ns: int) -> list[str]:
    uuid = Gpu(gpu).uuid
    labels = f'gpu="{gpu}",UUID="{uuid}",modelName="NVIDIA H100 80GB HBM3"'
    return [
        f"DCGM_FI_DEV_POWER_VIOLATION{{{labels}}} {power_ns}",
        f"DCGM_FI_DEV_THERMAL_VIOLATION{{{labels}}} {thermal_ns}",
        f"DCGM_FI_DEV_BOARD_LIMIT_VIOLATION{{{labels}}} 5000000000",
    ]


def test_a_rising_violation_counter_is_its_reason() -> None:
    reader = DcgmPageReader("http://127.0.0.1:9400/metrics", node=None, fallback_node="here")
    slow_cool = Gpu(0, sm_mhz=1500, temp=60, power=400)  # slow for no reason the inference can see
    first = read(reader, default_page([slow_cool], extra=_violations(0, 10**9, 10**9)))
    assert reasons(first[0]) == ([], THROTTLE_INFERRED)  # nothing to compare the counters with yet
    assert first[0].power_violation_seconds_total == pytest.approx(1.0)  # ns -> s
    assert first[0].board_limit_violation_seconds_total == pytest.approx(5.0)
    risen = read(reader, default_page([slow_cool], extra=_violations(0, 3 * 10**9, 10**9)), T + 10)
    assert reasons(risen[0]) == (["sw_power_cap"], THROTTLE_VIOLATION)
    both = read(reader, default_page([slow_cool], extra=_violations(0, 4 * 10**9, 2 * 10**9)), T + 20)
    assert reasons(both[0]) == (["sw_power_cap", "sw_thermal"], THROTTLE_VIOLATION)
    steady = read(reader, default_page([slow_cool], extra=_violations(0, 4 * 10**9, 2 * 10**9)), T + 30)
    assert reasons(steady[0]) == ([], THROTTLE_VIOLATION)  # the counters say no: not inferred over them
    reset = read(reader, default_page([slow_cool], extra=_violations(0, 10, 10)), T + 40)  # a driver reload
    assert reasons(reset[0]) == ([], THROTTLE_VIOLATION)


def _clock_events(power_cap: int, sw_thermal: int) -> list[str]:
    labels = f'gpu="0",UUID="{Gpu(0).uuid}",window_size_in_ms="300000"'
    return [
        f'DCGM_EXP_CLOCK_EVENTS_COUNT{{{labels},clock_event="power_cap"}} {power_cap}',
        f'DCGM_EXP_CLOCK_EVENTS_COUNT{{{labels},clock_event="sw_thermal"}} {sw_thermal}',
        f'DCGM_EXP_CLOCK_EVENTS_COUNT{{{labels},clock_event="a_reason_of_tomorrow"}} 3',
    ]


def test_clock_event_counts_are_reported_reasons_while_they_do_not_fall() -> None:
    reader = DcgmPageReader("http://127.0.0.1:9400/metrics", node=None, fallback_node="here")
    hot = Gpu(0, sm_mhz=1395, temp=89, power=521.4)  # the inference would say sw_thermal: the counts win
    first = read(reader, default_page([hot], extra=_clock_events(12, 0)))
    assert reasons(first[0]) == (["sw_power_cap"], THROTTLE_REPORTED)
    steady = read(reader, default_page([hot], extra=_clock_events(12, 4)), T + 10)
    assert reasons(steady[0]) == (["sw_power_cap", "sw_thermal"], THROTTLE_REPORTED)
    ended = read(reader, default_page([hot], extra=_clock_events(7, 4)), T + 20)  # power cap samples leave
    assert reasons(ended[0]) == (["sw_thermal"], THROTTLE_REPORTED)


def test_field_112_wins_and_is_reported() -> None:
    reader = DcgmPageReader("http://127.0.0.1:9400/metrics", node=None, fallback_node="here")
    line = f'DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{gpu="0",UUID="{HOT.uuid}"}} 4'
    gpus = read(reader, default_page([HOT], extra=[line, *_violations(0, 1, 1)]))
    assert reasons(gpus[0]) == (["sw_power_cap"], THROTTLE_REPORTED)


@pytest.mark.parametrize("generation", ["current", "alias"])
def test_opt_in_fields_in_gpulens_units(generation: str) -> None:
    names = {
        "current": ("PAGE_RETIRED_SBE_TOTAL", "PAGE_RETIRED_PENDING", "NVLINK_CRC_DATA_ERROR_TOTAL"),
        "alias": ("RETIRED_SBE", "RETIRED_PENDING", "NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"),
    }[generation] + {
        "current": ("SM_OCCUPANCY_RATIO", "FP64_UTIL_RATIO"),
        "alias": ("SM_OCCUPANCY", "PIPE_FP64_ACTIVE"),
    }[generation]
    sbe, pending, crc, occupancy, fp64 = names
    labels = f'gpu="0",UUID="{Gpu(0).uuid}"'
    extra = [
        f"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{{{labels}}} 17",
        f"DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{{{labels}}} 1",
        f"DCGM_FI_DEV_{sbe}{{{labels}}} 3",
        f"DCGM_FI_DEV_{pending}{{{labels}}} 1",
        f"DCGM_FI_DEV_{crc}{{{labels}}} 42",
        f"DCGM_FI_PROF_{occupancy}{{{labels}}} 0.625",
        f"DCGM_FI_PROF_{fp64}{{{labels}}} 0.125",
        f"DCGM_FI_DEV_RELIABILITY_VIOLATION{{{labels}}} 2500000000",
        f'DCGM_EXP_GPU_HEALTH_STATUS{{{labels},health_watch="PCIE",health_error_code="DCGM_FR_OK"}} 0',
        f'DCGM_EXP_GPU_HEALTH_STATUS{{{labels},health_watch="THERMAL",health_error_code="DCGM_FR_TEMP_VIOLATION"}} 10',
        f'DCGM_EXP_P2P_STATUS{{{labels},peer_gpu="1",link_status="OK"}} 0',
        f'DCGM_EXP_P2P_STATUS{{{labels},peer_gpu="2",link_status="OK"}} 0',
        f'DCGM_EXP_P2P_STATUS{{{labels},peer_gpu="3",link_status="TopologyNotSupported"}} 3',
        f'DCGM_EXP_GPU_HEALTH_STATUS{{{labels},health_watch="MEM"}} 7',  # no such result: counted, not used
    ]
    parsed = parse_dcgm_metrics(default_page([Gpu(0)], extra=extra), node=None, timestamp=T)
    [g] = parsed.gpus
    assert (g.ecc_corrected_errors_persistent_total, g.ecc_uncorrected_errors_persistent_total) == (17, 1)
    assert (g.retired_pages_single_bit_total, g.retired_pages_pending, g.nvlink_crc_data_errors_total) == (3, True, 42)
    assert (g.sm_occupancy_ratio, g.fp64_active_ratio) == (0.625, 0.125)
    assert g.reliability_violation_seconds_total == pytest.approx(2.5)
    assert (g.health_status, g.p2p_peers_ok) == (1, 2)  # warn: the worst watch
    assert parsed.error_counts() == {"dcgm_absurd_value": 1}


def test_a_default_page_serves_no_opt_in_field_and_none_is_made_up() -> None:
    [g] = parse_dcgm_metrics(default_page([Gpu(0)]), node=None, timestamp=T).gpus
    assert (g.health_status, g.p2p_peers_ok, g.power_violation_seconds_total, g.sm_occupancy_ratio) == (None,) * 4


@pytest.mark.parametrize("layout", ["rows", "columnar"])
def test_the_reasons_source_and_opt_in_fields_travel_in_the_snapshot(layout: str) -> None:
    """What a gpulens exporter reading a dcgm-exporter serves its collector: the source and the new fields as read."""
    reader = DcgmPageReader("http://127.0.0.1:9400/metrics", node=None, fallback_node="here")
    snapshot = reader.read(default_page([HOT], extra=_violations(0, 10**9, 10**9)), T).snapshot
    body = snapshot_to_bytes(snapshot, layout=layout)
    [g] = snapshot_from_bytes(body).gpus
    assert (g.throttle_reasons, g.throttle_reasons_source) == (0x20, THROTTLE_INFERRED)
    assert g.thermal_violation_seconds_total == pytest.approx(1.0)
