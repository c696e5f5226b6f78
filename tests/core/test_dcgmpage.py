"""Reading dcgm-exporter pages (gpulens.dcgmpage): both naming generations, units, sentinels, MIG, jobs, identity,
the text format, and property-based robustness."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpulens.dcgmfields import DCGM_FP64_BLANK, DCGM_INT32_BLANK, DCGM_INT64_BLANK
from gpulens.dcgmpage import DcgmParse, parse_dcgm_metrics
from gpulens.model import GpuReading, MigReading
from tests.fakes.dcgm_pages import (
    FIXTURE_NAMES,
    FIXTURE_TEXTS,
    FUZZ,
    GPU0,
    GPU1,
    ID0,
    MIB,
    MIG_GPU,
    fixture,
    mutated_fixture,
    parse,
)


def only_gpu(text: str) -> GpuReading:
    result = parse(text)
    assert len(result.gpus) == 1, result
    return result.gpus[0]


# --- both generations ----------------------------------------------------------------------------------------------

EXPECTED_GPU0 = {
    "model": "NVIDIA A100-SXM4-80GB",
    "pci_bus_id": "00000000:07:00.0",
    "driver_version": "550.54.15",
    "sm_clock_hertz": 1.41e9,
    "memory_clock_hertz": 1.593e9,
    "max_sm_clock_hertz": 1.41e9,
    "max_memory_clock_hertz": 1.593e9,
    "utilization_ratio": 0.45,
    "temperature_celsius": 45.0,
    "memory_temperature_celsius": 52.0,
    "slowdown_temperature_celsius": 87.0,
    "power_watts": 312.5,
    "power_limit_watts": 400.0,
    "energy_joules_total": 123_456_789.0,
    "memory_used_bytes": 40960 * MIB,
    "memory_reserved_bytes": 584 * MIB,
    "memory_total_bytes": (40960 + 39936 + 584) * MIB,
    "throttle_reasons": 0x4,
    "pcie_tx_bytes_per_second": 1.2e9,
    "pcie_rx_bytes_per_second": 2.4e9,
    "pcie_link_generation": 4,
    "pcie_link_generation_max": 4,
    "pcie_link_width": 16,
    "pcie_link_width_max": 16,
    "pcie_replays_total": 12,
    "nvlink_tx_bytes_per_second": 5.0e10,
    "nvlink_rx_bytes_per_second": 4.8e10,
    "nvlink_crc_flit_errors_total": 5,
    "nvlink_replay_errors_total": 1,
    "nvlink_recovery_errors_total": 0,
    "ecc_corrected_errors_total": 3,
    "ecc_uncorrected_errors_total": 0,
    "remapped_rows_correctable": 2,
    "remapped_rows_uncorrectable": 0,
    "remapped_rows_failure": False,
    "remapped_rows_pending": False,
    "sm_active_ratio": 0.82,
    "tensor_active_ratio": 0.41,
    "dram_active_ratio": 0.63,
}
EXPECTED_GPU1 = {
    "utilization_ratio": 1.0,
    "memory_temperature_celsius": None,  # a DCGM "not supported" sentinel
    "power_limit_watts": 350.0,  # the enforced limit wins over the management limit
    "sm_clock_hertz": 1.275e9,
    "pcie_link_generation": 3,
    "pcie_link_width": 8,
    # no PROF NVLink tx/rx: the 2000 MB/s (2e9 B/s) total is split evenly
    "nvlink_tx_bytes_per_second": 1.0e9,
    "nvlink_rx_bytes_per_second": 1.0e9,
    "remapped_rows_uncorrectable": 1,
    "remapped_rows_failure": True,
    "remapped_rows_pending": True,
}


@pytest.mark.parametrize("name", ["legacy.prom", "current.prom"])
def test_each_generation_gives_readings_in_our_units(name: str) -> None:
    result = parse(fixture(name))

    assert [(g.gpu, g.uuid) for g in result.gpus] == [(0, GPU0), (1, GPU1)]
    gpu0, gpu1 = result.gpus
    assert {key: getattr(gpu0, key) for key in EXPECTED_GPU0} == EXPECTED_GPU0
    assert {key: getattr(gpu1, key) for key in EXPECTED_GPU1} == EXPECTED_GPU1
    assert result.node == "gpu-node-07"
    assert result.driver_version == "550.54.15"
    assert result.bad_lines == 0
    assert result.problems == {"dcgm_sentinel": 1}


def test_both_generations_give_identical_records() -> None:
    assert parse(fixture("legacy.prom")).gpus == parse(fixture("current.prom")).gpus


def test_last_xid_is_reported_per_gpu_not_as_a_count() -> None:
    for name in ("legacy.prom", "current.prom"):
        result = parse(fixture(name))
        assert result.last_xid == {GPU0: 0, GPU1: 48}
        assert all(g.xid_errors == {} for g in result.gpus)  # counting is the stateful source's job


def test_a_legacy_name_always_carries_its_legacy_unit() -> None:
    # A 4.9-style Hz value under the MHz name is not silently believed: 1.41e9 MHz is beyond any clock.
    result = parse(f"DCGM_FI_DEV_SM_CLOCK{{{ID0}}} 1410000000\nDCGM_FI_DEV_MEM_CLOCK{{{ID0}}} 1593\n")
    assert result.gpus[0].sm_clock_hertz is None
    assert result.gpus[0].memory_clock_hertz == 1.593e9
    assert result.problems == {"dcgm_absurd_value": 1}


def test_nvlink_throughput_total_is_mb_per_second_and_used_only_without_tx_rx() -> None:
    gpu = only_gpu(f"DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL{{{ID0}}} 3000\n")
    assert (gpu.nvlink_tx_bytes_per_second, gpu.nvlink_rx_bytes_per_second) == (1.5e9, 1.5e9)
    gpu = only_gpu(f"DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL{{{ID0}}} 3000\nDCGM_FI_PROF_NVLINK_TX_BYTES{{{ID0}}} 7\n")
    assert (gpu.nvlink_tx_bytes_per_second, gpu.nvlink_rx_bytes_per_second) == (7.0, None)


@pytest.mark.parametrize(
    ("lines", "field_name", "expected"),
    [
        # DCGM 4.6's GPU_UTIL_RATIO is field 203 like GPU_UTIL: still a percentage
        (["DCGM_FI_DEV_GPU_UTIL_RATIO 91"], "utilization_ratio", 0.91),
        (["DCGM_FI_DEV_GPU_UTIL_RATIO 1"], "utilization_ratio", 0.01),
        (["dcgm_gpu_utilization 35"], "utilization_ratio", 0.35),
        # GR_ENGINE_ACTIVE (0-1) is the utilization where GPU_UTIL is absent; GPU_UTIL wins where both are served
        (["DCGM_FI_PROF_GR_ENGINE_ACTIVE 0.3"], "utilization_ratio", 0.3),
        (["DCGM_FI_PROF_GR_ENGINE_ACTIVE 0.3", "DCGM_FI_DEV_GPU_UTIL 10"], "utilization_ratio", 0.1),
        (["DCGM_FI_DEV_GPU_UTIL 10", "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO 0.3"], "utilization_ratio", 0.1),
        (
            ["DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS 450", "DCGM_FI_DEV_POWER_MGMT_LIMIT 500"],
            "power_limit_watts",
            450.0,
        ),
        # GDDR boards (T4, L4, L40S) report memory temperature 0: no sensor, unknown
        (["DCGM_FI_DEV_MEMORY_TEMP 0"], "memory_temperature_celsius", None),
        (["DCGM_FI_DEV_MEMORY_TEMP_CELSIUS 0"], "memory_temperature_celsius", None),
        (["DCGM_FI_DEV_MEMORY_TEMP 71"], "memory_temperature_celsius", 71.0),
        # ...unless it is a sentinel, then the legacy value stands
        (["DCGM_FI_DEV_GPU_TEMP_CELSIUS 140737488355328", "DCGM_FI_DEV_GPU_TEMP 61"], "temperature_celsius", 61.0),
        (["DCGM_FI_DEV_POWER_MGMT_LIMIT 500", "DCGM_FI_DEV_ENFORCED_POWER_LIMIT 450"], "power_limit_watts", 450.0),
        (["DCGM_FI_DEV_POWER_MGMT_LIMIT 500"], "power_limit_watts", 500.0),
        # total memory: FB_TOTAL, else used + free + reserved, reserved counted 0 when absent, else unknown
        (["DCGM_FI_DEV_FB_TOTAL 80", "DCGM_FI_DEV_FB_USED 1", "DCGM_FI_DEV_FB_FREE 2"], "memory_total_bytes", 80 * MIB),
        (["DCGM_FI_DEV_FB_USED 10", "DCGM_FI_DEV_FB_FREE 20"], "memory_total_bytes", 30 * MIB),
        (["dcgm_fb_used 10", "dcgm_fb_free 20"], "memory_total_bytes", 30 * MIB),
        (["DCGM_FI_DEV_FB_USED 10"], "memory_total_bytes", None),
        (["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION 1500"], "energy_joules_total", 1.5),
        (["DCGM_FI_DEV_CLOCKS_EVENT_REASONS 136"], "throttle_reasons", 0x88),
        # two names of one field (202): the first sample wins
        (["DCGM_FI_DEV_PCIE_REPLAY_COUNTER 3", "DCGM_FI_DEV_PCIE_REPLAY_TOTAL 4"], "pcie_replays_total", 3),
        # the deprecated PCIE_TX_THROUGHPUT (KB/s) only without PROF_PCIE_TX_BYTES (B/s)
        (["DCGM_FI_DEV_PCIE_TX_THROUGHPUT 2"], "pcie_tx_bytes_per_second", 2048.0),
        (["DCGM_FI_DEV_PCIE_TX_THROUGHPUT 2", "DCGM_FI_PROF_PCIE_TX_BYTES 7"], "pcie_tx_bytes_per_second", 7.0),
        (["DCGM_FI_DEV_XID_ERROR 79"], None, {GPU0: 79}),
    ],
)
def test_names_units_and_precedence(lines: list[str], field_name: str | None, expected: object) -> None:
    text = "".join(line.replace(" ", f"{{{ID0}}} ", 1) + "\n" for line in lines)
    result = parse(text)
    value = result.last_xid if field_name is None else getattr(result.gpus[0], field_name)
    assert value == expected


# --- sentinels and absurd values -----------------------------------------------------------------------------------

SENTINELS = [
    *(str(DCGM_INT64_BLANK + i) for i in range(4)),
    "9223372036854775807",
    *(str(DCGM_INT32_BLANK + i) for i in range(4)),
    *(f"{DCGM_FP64_BLANK + i:f}" for i in range(4)),
    "1.40737488355331e+14",
]


@pytest.mark.parametrize("value", SENTINELS)
def test_sentinels_are_missing_values_never_numbers(value: str) -> None:
    text = f"DCGM_FI_DEV_GPU_TEMP{{{ID0}}} {value}\nDCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{ID0}}} {value}\n"
    result = parse(text)
    gpu = result.gpus[0]
    assert (gpu.temperature_celsius, gpu.pcie_replays_total) == (None, None)
    assert result.problems == {"dcgm_sentinel": 2}


def test_values_next_to_the_sentinels_are_kept() -> None:
    energy_mj = DCGM_INT32_BLANK + 4  # a real energy counter may pass the int32 sentinels
    gpu = only_gpu(f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{ID0}}} {energy_mj}\n")
    assert gpu.energy_joules_total == energy_mj / 1000


@pytest.mark.parametrize(
    ("metric", "value", "field_name"),
    [
        ("DCGM_FI_DEV_GPU_UTIL", "150", "utilization_ratio"),
        ("DCGM_FI_DEV_GPU_UTIL_RATIO", "101", "utilization_ratio"),  # a percentage, like GPU_UTIL
        ("DCGM_FI_PROF_SM_ACTIVE", "1.01", "sm_active_ratio"),
        ("DCGM_FI_DEV_FB_USED", "-5", "memory_used_bytes"),
        ("DCGM_FI_DEV_FB_USED", "1e-7", "memory_used_bytes"),
        ("DCGM_FI_DEV_GPU_TEMP", "NaN", "temperature_celsius"),
        ("DCGM_FI_DEV_GPU_TEMP", "-3", "temperature_celsius"),
        ("DCGM_FI_DEV_POWER_USAGE", "+Inf", "power_watts"),
        ("DCGM_FI_DEV_POWER_USAGE", "-Inf", "power_watts"),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "2.5", "pcie_replays_total"),
        ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "128", "pcie_link_width"),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "2", "remapped_rows_failure"),
        ("DCGM_FI_PROF_PCIE_TX_BYTES", "2e13", "pcie_tx_bytes_per_second"),
        ("DCGM_FI_DEV_ENC_UTIL", "150", "encoder_utilization_ratio"),  # 1.5: above its catalogue range
    ],
)
def test_absurd_values_are_dropped_and_counted(metric: str, value: str, field_name: str) -> None:
    result = parse(f"{metric}{{{ID0}}} {value}\nDCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{ID0}}} 0\n")
    assert getattr(result.gpus[0], field_name) is None
    assert result.problems == {"dcgm_absurd_value": 1}


def test_negative_zero_becomes_zero() -> None:
    gpu = only_gpu(f"DCGM_FI_DEV_GPU_UTIL_RATIO{{{ID0}}} -0.0\n")
    assert gpu.utilization_ratio == 0.0
    assert math.copysign(1.0, gpu.utilization_ratio) == 1.0


# --- MIG, jobs, identity -------------------------------------------------------------------------------------------


def test_mig_instances_belong_to_their_parent_gpu() -> None:
    result = parse(fixture("mig.prom"))

    assert [(g.gpu, g.uuid) for g in result.gpus] == [(0, MIG_GPU), (1, "GPU-c4d2e8f6-7a19-4b3e-8d05-1f6a9c2e7b38")]
    parent, whole = result.gpus
    assert (parent.mig_enabled, whole.mig_enabled) == (True, None)
    # device-wide values reach the parent from its instances' samples; per-instance ones do not
    assert (parent.temperature_celsius, parent.power_watts) == (41.0, 201.75)
    assert (parent.memory_used_bytes, parent.sm_active_ratio) == (None, None)
    assert (whole.sm_active_ratio, whole.memory_total_bytes) == (0.0, 80999 * MIB)
    assert result.migs == (
        MigReading(
            node="mig-node-02",
            gpu=0,
            uuid=MIG_GPU,
            mig_uuid=f"MIG-{MIG_GPU}/1",
            gpu_instance_id=1,
            profile="3g.40gb",
            memory_used_bytes=30000 * MIB,
            memory_total_bytes=40192 * MIB,
        ),
        MigReading(
            node="mig-node-02",
            gpu=0,
            uuid=MIG_GPU,
            mig_uuid=f"MIG-{MIG_GPU}/2",
            gpu_instance_id=2,
            profile="3g.40gb",
            memory_used_bytes=12 * MIB,
            memory_total_bytes=40192 * MIB,
        ),
    )
    assert [(j.gpu, j.uuid, j.job_id) for j in result.jobs] == [
        (0, MIG_GPU, "inference/triton-a"),
        (0, MIG_GPU, "inference/triton-b"),
    ]


def test_a_gpu_level_sample_wins_over_a_mig_copy() -> None:
    text = f'DCGM_FI_DEV_GPU_TEMP{{{ID0},GPU_I_ID="3",GPU_I_PROFILE="1g.10gb"}} 70\nDCGM_FI_DEV_GPU_TEMP{{{ID0}}} 55\n'
    result = parse(text)
    assert result.gpus[0].temperature_celsius == 55.0
    assert [(m.gpu_instance_id, m.profile, m.memory_used_bytes) for m in result.migs] == [(3, "1g.10gb", None)]


def test_kubernetes_and_slurm_jobs() -> None:
    legacy = parse(fixture("legacy.prom"))
    assert [(j.node, j.gpu, j.uuid, j.job_id, j.user) for j in legacy.jobs] == [
        ("gpu-node-07", 0, GPU0, "ml-team/llm-train-0", None)
    ]
    current = parse(fixture("current.prom"))
    assert [(j.gpu, j.job_id) for j in current.jobs] == [(0, "4711"), (1, "4712")]


def test_a_gpu_shared_by_two_pods_gives_two_jobs_and_one_value() -> None:
    text = (
        f'DCGM_FI_DEV_GPU_TEMP{{{ID0},namespace="a",pod="p1",container="c"}} 50\n'
        f'DCGM_FI_DEV_GPU_TEMP{{{ID0},namespace="b",pod="p2",container="c"}} 50\n'
        f'DCGM_FI_DEV_POWER_USAGE{{{ID0},pod="lonely"}} 100\n'
    )
    result = parse(text)
    assert [j.job_id for j in result.jobs] == ["a/p1", "b/p2", "lonely"]
    assert (len(result.gpus), result.gpus[0].temperature_celsius) == (1, 50.0)


def test_duplicate_gpus_are_counted_once_and_the_later_dropped() -> None:
    text = (
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{GPU0}"}} 40\n'
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="1",UUID="{GPU0}"}} 90\n'  # same UUID, other index
        f'DCGM_FI_DEV_POWER_USAGE{{gpu="1",UUID="{GPU0}"}} 90\n'
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{GPU1}"}} 91\n'  # index 0 claimed by a second UUID
    )
    result = parse(text)
    assert [(g.gpu, g.uuid, g.temperature_celsius, g.power_watts) for g in result.gpus] == [(0, GPU0, 40.0, None)]
    assert result.problems == {"dcgm_duplicate_gpu": 2}


def test_samples_without_gpu_identity_or_of_other_entities() -> None:
    text = (
        'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 40\n'  # no UUID
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="x",UUID="{GPU0}"}} 40\n'
        f'DCGM_FI_DEV_GPU_TEMP{{{ID0},GPU_I_ID="one"}} 40\n'
        'DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{nvswitch="0",link="3"} 9\n'  # a switch: not ours
        'DCGM_FI_DEV_CPU_TEMP_CURRENT{cpu="0"} 39.5\n'  # unknown name
        "go_goroutines 12\n"
    )
    result = parse(text)
    assert result.gpus == ()
    assert result.problems == {"dcgm_bad_identity": 3}
    assert (result.samples, result.bad_lines) == (6, 0)


def test_node_name_comes_from_argument_then_hostname_label_then_fallback() -> None:
    text = f'DCGM_FI_DEV_GPU_TEMP{{{ID0},hostname="from-label"}} 40\n'
    assert parse(text).node == "from-label"
    assert parse(text, node="given").gpus[0].node == "given"
    bare = parse_dcgm_metrics(f"DCGM_FI_DEV_GPU_TEMP{{{ID0}}} 40\n", node=None, timestamp=0.0, fallback_node="fb")
    assert (bare.node, bare.gpus[0].node) == (None, "fb")


# --- the text format -----------------------------------------------------------------------------------------------


def test_crlf_line_endings_parse_the_same() -> None:
    text = fixture("legacy.prom")
    assert parse(text.replace("\n", "\r\n")) == parse(text)


def test_escaped_label_values() -> None:
    text = f'DCGM_FI_DEV_GPU_TEMP{{{ID0}, namespace="ns",pod="we\\"ird\\\\pod\\nx" , hostname="h\\\\1",}} 40\n'
    result = parse(text)
    assert [j.job_id for j in result.jobs] == ['ns/we"ird\\pod\nx']
    assert result.node == "h\\1"
    assert result.bad_lines == 0


@pytest.mark.parametrize(
    ("value", "expected"),
    [("45", 0.45), ("4.5e1", 0.45), (".5", 0.005), ("+45", 0.45), ("45 1700000000000", 0.45), ("45 -5", 0.45)],
)
def test_value_and_timestamp_forms(value: str, expected: float) -> None:
    assert only_gpu(f"DCGM_FI_DEV_GPU_UTIL{{{ID0}}} {value}\n").utilization_ratio == expected


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (f"DCGM_FI_DEV_GPU_UTIL{{{ID0}}} 1_000", "bad_value"),
        (f"DCGM_FI_DEV_GPU_UTIL{{{ID0}}} 0x10", "bad_value"),
        (f"DCGM_FI_DEV_GPU_UTIL{{{ID0}}}", "bad_value"),
        (f"DCGM_FI_DEV_GPU_UTIL{{{ID0}}} 5 1.5", "bad_timestamp"),
        (f"DCGM_FI_DEV_GPU_UTIL{{{ID0},}} 5 1 1", "trailing_garbage"),
        (f"DCGM_FI_DEV_GPU_UTIL{{{ID0},,}} 5", "bad_labels"),
        (f'DCGM_FI_DEV_GPU_UTIL{{{ID0},"quoted"="name"}} 5', "bad_labels"),
        ("DCGM-FI 5", "bad_name"),
        ("# HELP 9lives doc", "bad_comment"),
        ("# TYPE 9lives gauge", "bad_comment"),
    ],
)
def test_bad_lines_by_reason(line: str, reason: str) -> None:
    result = parse(f"# a free comment\n\n   \n{line}\nDCGM_FI_DEV_GPU_TEMP{{{ID0}}} 40\n")
    assert result.bad_line_reasons == {reason: 1}
    assert (result.bad_lines, result.first_bad_line, result.samples) == (1, 4, 1)
    assert result.gpus[0].temperature_celsius == 40.0


@pytest.mark.parametrize(
    "line", ["# TYPE DCGM_FI_DEV_GPU_UTIL", "# HELP", "# HELP   ", "# TYPE DCGM_FI_DEV_GPU_UTIL gaugey", "# Hrandom"]
)
def test_comments_prometheus_reads_as_comments_are_not_bad_lines(line: str) -> None:
    result = parse(f"{line}\nDCGM_FI_DEV_GPU_TEMP{{{ID0}}} 40\n")
    assert (result.bad_lines, result.samples) == (0, 1)


def test_a_malformed_page_parses_what_it_can_and_counts_every_bad_line() -> None:
    result = parse(fixture("malformed.prom"))

    assert result.bad_lines == 11
    assert result.bad_line_reasons == {
        "bad_value": 2,
        "bad_labels": 4,
        "bad_timestamp": 1,
        "bad_name": 1,
        "duplicate_label": 1,
        "duplicate_series": 1,
        "trailing_garbage": 1,
    }
    assert result.problems["dcgm_truncated"] == 1
    assert (result.samples, result.first_bad_line) == (4, 7)
    gpu = only_gpu(fixture("malformed.prom"))
    # the first FB_USED sample wins: the one whose pod label keeps its unknown escape
    assert (gpu.temperature_celsius, gpu.memory_clock_hertz, gpu.memory_used_bytes) == (51.0, 2.619e9, 100 * MIB)
    assert [j.job_id for j in result.jobs] == ["a\\qb"]
    assert result.node == "bad-node-01"


# --- property-based fuzzing ----------------------------------------------------------------------------------------


def assert_sane(result: DcgmParse, text: str) -> None:
    """Invariants every parse must hold, whatever the input."""
    assert result.bad_lines == sum(result.bad_line_reasons.values())
    assert result.samples + result.bad_lines <= len(text.split("\n"))
    assert all(n > 0 for n in result.problems.values())
    records: list[GpuReading | MigReading] = [*result.gpus, *result.migs]
    for record in records:
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if f.name == "xid_errors":
                assert value == {}
            elif isinstance(value, int | float) and not isinstance(value, bool) and f.name != "timestamp":
                assert math.isfinite(value), f.name
                assert value >= 0, (f.name, value)
                if f.name.endswith("_ratio"):
                    assert value <= 1.0, (f.name, value)
    assert all(code >= 0 for code in result.last_xid.values())


@FUZZ
@given(st.text())
def test_fuzz_arbitrary_text_never_raises(text: str) -> None:
    assert_sane(parse(text), text)


@FUZZ
@given(mutated_fixture())
def test_fuzz_mutated_fixtures_never_raise(data: bytes) -> None:
    text = data.decode("utf-8", errors="replace")
    assert_sane(parse(text), text)


LINE_PARTS = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS", "x"]),
        "gpu": st.sampled_from(["0", "1", "", "-1", "99999999999"]),
        "uuid": st.sampled_from([GPU0, GPU1, ""]),
        "mig": st.sampled_from(["", "1", "2", "z"]),
        "value": st.one_of(
            st.floats(allow_nan=True, allow_infinity=True).map(repr),
            st.integers(-(2**64), 2**64).map(str),
            st.sampled_from(SENTINELS),
        ),
    }
)


@FUZZ
@given(st.lists(LINE_PARTS, max_size=30))
def test_fuzz_well_formed_lines_with_hostile_values(parts: list[dict[str, str]]) -> None:
    text = "".join(
        f'{p["name"]}{{gpu="{p["gpu"]}",UUID="{p["uuid"]}",GPU_I_ID="{p["mig"]}",pod="p{p["gpu"]}"}} {p["value"]}\n'
        for p in parts
    )
    result = parse(text)
    assert_sane(result, text)
    assert result.bad_lines == len(parts) - len({(p["name"], p["gpu"], p["uuid"], p["mig"]) for p in parts})


@FUZZ
@given(st.data())
def test_deleting_whole_lines_creates_no_bad_line(data: st.DataObject) -> None:
    lines = FIXTURE_TEXTS["legacy.prom"].split("\n")
    kept = data.draw(st.lists(st.booleans(), min_size=len(lines), max_size=len(lines)))
    text = "\n".join(line for line, keep in zip(lines, kept, strict=True) if keep)
    result = parse(text)
    assert result.bad_lines == 0
    complete = text.split("\n")[:-1]  # the last line, without its line feed, is never used
    assert result.samples == sum(1 for line in complete if line.startswith("DCGM_"))


@FUZZ
@given(st.data())
def test_injected_garbage_lines_are_counted_exactly(data: st.DataObject) -> None:
    lines = FIXTURE_TEXTS["current.prom"].split("\n")
    garbage = st.text(st.characters(blacklist_characters="\n"), max_size=40).map(lambda s: "@" + s)
    for _ in range(count := data.draw(st.integers(1, 10))):
        lines.insert(data.draw(st.integers(0, len(lines))), data.draw(garbage))
    result = parse("\n".join(lines) + "\n")
    assert result.bad_lines == count
    assert result.gpus == parse(FIXTURE_TEXTS["current.prom"]).gpus


@FUZZ
@given(st.sampled_from(FIXTURE_NAMES[:3]), st.integers(min_value=0))
def test_truncation_breaks_at_most_the_last_line(name: str, cut: int) -> None:
    text = FIXTURE_TEXTS[name]
    truncated = text[: cut % (len(text) + 1)]
    result = parse(truncated)
    assert result.bad_lines <= 1
    assert_sane(result, truncated)


def test_a_base_unit_announced_in_help_is_believed_only_for_scaled_fields() -> None:
    text = (
        "# HELP DCGM_FI_DEV_SM_CLOCK SM clock frequency (in Hz).\n"
        f"DCGM_FI_DEV_SM_CLOCK{{{ID0}}} 1410000000\n"
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in B).\n"
        f"DCGM_FI_DEV_FB_USED{{{ID0}}} 1048576\n"
        "# HELP DCGM_FI_PROF_GR_ENGINE_ACTIVE Ratio of time the graphics engine is active (in %).\n"
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{ID0}}} 0.7\n"  # 1.x help texts say % over 0-1 ratios: not believed
        "# HELP DCGM_FI_DEV_MEM_CLOCK Memory clock frequency (in MHz).\n"
        f"DCGM_FI_DEV_MEM_CLOCK{{{ID0}}} 1593\n"
    )
    gpu = only_gpu(text)
    assert (gpu.sm_clock_hertz, gpu.memory_used_bytes) == (1.41e9, 1048576)
    assert (gpu.utilization_ratio, gpu.memory_clock_hertz) == (0.7, 1.593e9)
