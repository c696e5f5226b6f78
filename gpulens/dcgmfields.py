"""The DCGM field table: each DCGM field gpulens reads or writes, every name it is exported under, and its unit.

One row per DCGM field (``DcgmField``), identified by its **field id** (``dcgm_fields.h``): the ``GpuReading`` field
it feeds, its unit and the factor to gpulens's units, and its names by generation:

* ``current``: the name DCGM 4.6's ``dcgmlib/dcgm_fields.h`` defines with the id (``DCGM_FI_DEV_GPU_UTIL_RATIO``).
* ``aliases``: the deprecated names the 4.6 header keeps for the same id (``DCGM_FI_DEV_GPU_UTIL``); the first is the
  name dcgm-exporter 2.x-4.x serves by default and the one ``--dcgm-compat`` writes.
* ``old``: dcgm-exporter ``--use-old-namespace`` and 1.x names (``dcgm_gpu_utilization``; label ``uuid``).

DCGM 4.6 renamed fields without changing their ids or units: ``DCGM_FI_DEV_GPU_UTIL_RATIO`` is field 203 and still
holds 0-100; ``..._PROF_*_RATIO`` still hold 0-1. So every name of a row carries the row's unit, whichever
generation wrote it, and a name converts with its row's ``multiply``/``divide``. tests/fixtures/dcgm/
dcgm_fields_4.6.csv lists (name, id, unit) from the header; a test holds this table to it.

When several rows feed one target the higher ``rank`` wins: GPU_UTIL over GR_ENGINE_ACTIVE (the utilization NVIDIA
recommends for MIG and pages without GPU_UTIL), the enforced power limit over the requested one, the PROF PCIe byte
rates over the deprecated PCIE_*_THROUGHPUT (KB/s).

The rows with ``compat_help`` define the ``--dcgm-compat`` families: written under ``compat_name`` in the row's unit,
in the order of the table.

Also here: DCGM's blank sentinels, used when reading a page. A row's plausible range is its field's range in the
metric catalogue (``gpulens.metriccatalogue``), kept there only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from gpulens.metriccatalogue import FIELD_BY_NAME, QUANTITIES, Quantity
from gpulens.model import GpuReading, MigReading

# --- DCGM blank sentinels (dcgm_structs.h) -------------------------------------------------------------------------

DCGM_INT32_BLANK: Final = 0x7FFFFFF0
DCGM_INT64_BLANK: Final = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK: Final = 140737488355328.0  # 2**47
# BLANK, NOT_FOUND, NOT_SUPPORTED, NOT_PERMISSIONED
_EXACT_SENTINELS: Final = frozenset(
    [float(DCGM_INT32_BLANK + i) for i in range(4)] + [DCGM_FP64_BLANK + i for i in range(4)]
)
_INT64_BLANK_FLOAT: Final = float(DCGM_INT64_BLANK)


def is_dcgm_sentinel(value: float) -> bool:
    """True for DCGM's blank / not-found / not-supported / not-permissioned values (int64, int32 and fp64).

    Any value >= ``DCGM_INT64_BLANK``; exactly ``DCGM_INT32_BLANK`` .. +3 and ``DCGM_FP64_BLANK`` .. +3 (only exact
    values, because a genuine counter, energy in mJ say, may legitimately pass those magnitudes).
    """
    return value >= _INT64_BLANK_FLOAT or value in _EXACT_SENTINELS


MIB: Final = 1024 * 1024
NANO: Final = 1_000_000_000
MEGA: Final = 1_000_000
KIB: Final = 1024

# Targets that are not GpuReading fields: combined into real fields when records are built.
FREE: Final = "memory_free_bytes"
NVLINK_TOTAL: Final = "nvlink_total_bytes_per_second"
XID_TARGET: Final = "xid"
# Read as GPU series but with no place in GpuReading (MEM_COPY_UTIL is written from dram_active_ratio).
MEM_COPY: Final = "mem_copy_utilization"
ENCODER: Final = "encoder_utilization_ratio"
DECODER: Final = "decoder_utilization_ratio"
# The range (``gpulens.metriccatalogue.QUANTITIES``) of each target that is not a field of the metric catalogue; a
# catalogue field's range is the catalogue's.
_OWN_RANGES: Final = {
    FREE: "bytes",
    NVLINK_TOTAL: "bytes_per_second",
    MEM_COPY: "ratio",
    XID_TARGET: "xid",
    "throttle_reasons": "count",
}


def _quantity(target: str) -> Quantity:
    spec = FIELD_BY_NAME.get(target)
    return spec.quantity if spec is not None else QUANTITIES[_OWN_RANGES[target]]


# --- the table -----------------------------------------------------------------------------------------------------

Generation = Literal["current", "alias", "old"]


@dataclass(frozen=True, slots=True)
class DcgmName:
    """One exported name of a field and the generation it belongs to."""

    name: str
    generation: Generation


@dataclass(frozen=True, slots=True)
class DcgmField:
    """One DCGM field: target, quantity, id, unit and conversion, names, and its ``--dcgm-compat`` HELP text.

    gpulens value = exported value * ``multiply`` / ``divide``. ``zero_is_blank``: DCGM reports 0 where the
    hardware has no sensor (memory temperature on GDDR boards), so 0 means unknown.
    """

    target: str
    quantity: Quantity
    field_id: int
    unit: str
    current: str
    aliases: tuple[str, ...] = ()
    old: tuple[str, ...] = ()
    multiply: float = 1
    divide: float = 1
    rank: int = 0
    compat_help: str | None = None
    zero_is_blank: bool = False

    @property
    def names(self) -> tuple[DcgmName, ...]:
        return (
            DcgmName(self.current, "current"),
            *(DcgmName(n, "alias") for n in self.aliases),
            *(DcgmName(n, "old") for n in self.old),
        )

    @property
    def compat_name(self) -> str:
        """The name dcgm-exporter's default counters use: the first alias, else the current name."""
        return self.aliases[0] if self.aliases else self.current


def _names(names: str | tuple[str, ...]) -> tuple[str, ...]:
    return (names,) if isinstance(names, str) else names


def _field(
    target: str,
    field_id: int,
    unit: str,
    current: str,
    aliases: str | tuple[str, ...] = (),
    old: str | tuple[str, ...] = (),
    *,
    multiply: float = 1,
    divide: float = 1,
    rank: int = 0,
    compat: str | None = None,
    zero_is_blank: bool = False,
) -> DcgmField:
    return DcgmField(
        target,
        _quantity(target),
        field_id,
        unit,
        current,
        _names(aliases),
        _names(old),
        multiply,
        divide,
        rank,
        compat,
        zero_is_blank,
    )


_P = "DCGM_FI_PROF_"
_D = "DCGM_FI_DEV_"

# In the order --dcgm-compat writes its families (dcgm-exporter's default counters first). Units as in the
# dcgm_fields.h comments and dcgm-exporter's default-counters.csv: "%" 0-100, "ratio" 0-1, "MiB", "MHz", "mJ", "W",
# "C", "B/s", "KB/s", "MB/s", "count", "bitmask", "bool", "gen", "lanes", "xid".
# fmt: off
FIELDS: Final[tuple[DcgmField, ...]] = (
    _field("utilization_ratio", 203, "%", _D + "GPU_UTIL_RATIO", _D + "GPU_UTIL", "dcgm_gpu_utilization",
           divide=100, rank=1, compat="GPU utilization (in %)."),
    _field("memory_used_bytes", 252, "MiB", _D + "FB_USED", (), "dcgm_fb_used", multiply=MIB,
           compat="Framebuffer memory used (in MiB)."),
    _field(FREE, 251, "MiB", _D + "FB_FREE", (), "dcgm_fb_free", multiply=MIB,
           compat="Framebuffer memory free (in MiB)."),
    _field("temperature_celsius", 150, "C", _D + "GPU_TEMP_CELSIUS", _D + "GPU_TEMP", "dcgm_gpu_temp",
           compat="GPU temperature (in C)."),
    _field("memory_temperature_celsius", 140, "C", _D + "MEMORY_TEMP_CELSIUS", _D + "MEMORY_TEMP",
           "dcgm_memory_temp", compat="Memory temperature (in C).", zero_is_blank=True),
    _field("power_watts", 155, "W", _D + "BOARD_POWER_WATTS", _D + "POWER_USAGE", "dcgm_power_usage",
           compat="Power draw (in W)."),
    _field("energy_joules_total", 156, "mJ", _D + "TOTAL_ENERGY_CONSUMPTION", (),
           "dcgm_total_energy_consumption", divide=1000, compat="Total energy consumption since boot (in mJ)."),
    _field("sm_clock_hertz", 100, "MHz", _D + "SM_CLOCK", (), "dcgm_sm_clock", multiply=MEGA,
           compat="SM clock frequency (in MHz)."),
    _field("memory_clock_hertz", 101, "MHz", _D + "MEM_CLOCK", (), "dcgm_memory_clock", multiply=MEGA,
           compat="Memory clock frequency (in MHz)."),
    _field("pcie_replays_total", 202, "count", _D + "PCIE_REPLAY_TOTAL", _D + "PCIE_REPLAY_COUNTER",
           "dcgm_pcie_replay_counter", compat="Total number of PCIe retries."),
    _field(MEM_COPY, 204, "%", _D + "MEM_COPY_UTIL", (), "dcgm_mem_copy_utilization", divide=100,
           compat="Memory utilization (in %)."),
    _field(ENCODER, 206, "%", _D + "ENC_UTIL", (), "dcgm_enc_utilization", divide=100,
           compat="Encoder utilization (in %)."),
    _field(DECODER, 207, "%", _D + "DEC_UTIL", (), "dcgm_dec_utilization", divide=100,
           compat="Decoder utilization (in %)."),
    _field("memory_reserved_bytes", 253, "MiB", _D + "FB_RESERVED", multiply=MIB,
           compat="Framebuffer memory reserved (in MiB)."),
    _field("ecc_corrected_errors_total", 310, "count", _D + "ECC_SBE_VOL_TOTAL", (),
           "dcgm_ecc_sbe_volatile_total", compat="Total number of single-bit volatile ECC errors."),
    _field("ecc_uncorrected_errors_total", 311, "count", _D + "ECC_DBE_VOL_TOTAL", (),
           "dcgm_ecc_dbe_volatile_total", compat="Total number of double-bit volatile ECC errors."),
    # Both directions summed; DCGM 4.6 renamed the field (449) NVLINK_THROUGHPUT_TOTAL.
    _field(NVLINK_TOTAL, 449, "MB/s", _D + "NVLINK_THROUGHPUT_TOTAL", _D + "NVLINK_BANDWIDTH_TOTAL",
           "dcgm_nvlink_bandwidth_total", multiply=MEGA,
           compat="Total number of NVLink bandwidth counters for all lanes (in MB/s)."),
    _field("pcie_tx_bytes_per_second", 1009, "B/s", _P + "PCIE_TX_BYTES", (), "dcgm_fi_prof_pcie_tx_bytes",
           rank=1, compat="The rate of data transmitted over the PCIe bus (in B/s)."),
    _field("pcie_rx_bytes_per_second", 1010, "B/s", _P + "PCIE_RX_BYTES", (), "dcgm_fi_prof_pcie_rx_bytes",
           rank=1, compat="The rate of data received over the PCIe bus (in B/s)."),
    _field("nvlink_tx_bytes_per_second", 1011, "B/s", _P + "NVLINK_TX_BYTES",
           compat="The rate of data transmitted over NVLink (in B/s)."),
    _field("nvlink_rx_bytes_per_second", 1012, "B/s", _P + "NVLINK_RX_BYTES",
           compat="The rate of data received over NVLink (in B/s)."),
    _field("utilization_ratio", 1001, "ratio", _P + "GR_ENGINE_UTIL_RATIO", _P + "GR_ENGINE_ACTIVE",
           "dcgm_fi_prof_gr_engine_active", compat="Ratio of time the graphics engine is active."),
    _field("sm_active_ratio", 1002, "ratio", _P + "SM_UTIL_RATIO", _P + "SM_ACTIVE", "dcgm_fi_prof_sm_active",
           compat="The ratio of cycles an SM has at least 1 warp assigned."),
    _field("tensor_active_ratio", 1004, "ratio", _P + "TENSOR_UTIL_RATIO", _P + "PIPE_TENSOR_ACTIVE",
           "dcgm_fi_prof_pipe_tensor_active", compat="Ratio of cycles the tensor (HMMA) pipe is active."),
    _field("dram_active_ratio", 1005, "ratio", _P + "DRAM_UTIL_RATIO", _P + "DRAM_ACTIVE",
           "dcgm_fi_prof_dram_active", compat="Ratio of cycles the device memory interface is active."),
    _field("remapped_rows_uncorrectable", 393, "count", _D + "ROW_REMAP_UNCORRECTABLE_TOTAL",
           _D + "UNCORRECTABLE_REMAPPED_ROWS", compat="Number of remapped rows for uncorrectable errors"),
    _field("remapped_rows_correctable", 394, "count", _D + "ROW_REMAP_CORRECTABLE_TOTAL",
           _D + "CORRECTABLE_REMAPPED_ROWS", compat="Number of remapped rows for correctable errors"),
    _field("remapped_rows_failure", 395, "bool", _D + "ROW_REMAP_FAILED", _D + "ROW_REMAP_FAILURE",
           compat="Whether remapping of rows has failed"),
    # XID: the last one seen (sticky), not a count; --dcgm-compat writes it after the others.
    _field(XID_TARGET, 230, "xid", _D + "XID_ERROR", _D + "XID_ERRORS", "dcgm_xid_errors",
           compat="Value of the last XID error encountered."),
    # Read only.
    _field("memory_total_bytes", 250, "MiB", _D + "FB_TOTAL", multiply=MIB),
    _field("slowdown_temperature_celsius", 158, "C", _D + "GPU_TEMP_SLOWDOWN_CELSIUS", _D + "SLOWDOWN_TEMP"),
    _field("power_limit_watts", 160, "W", _D + "BOARD_POWER_LIMIT_REQUESTED_WATTS", _D + "POWER_MGMT_LIMIT"),
    _field("power_limit_watts", 164, "W", _D + "BOARD_POWER_LIMIT_ENFORCED_WATTS",
           _D + "ENFORCED_POWER_LIMIT", rank=1),  # the enforced limit wins
    _field("max_sm_clock_hertz", 113, "MHz", _D + "MAX_SM_CLOCK", multiply=MEGA),
    _field("max_memory_clock_hertz", 114, "MHz", _D + "MAX_MEM_CLOCK", multiply=MEGA),
    _field("throttle_reasons", 112, "bitmask", _D + "CLOCKS_EVENT_REASONS", _D + "CLOCK_THROTTLE_REASONS"),
    _field("pcie_link_generation", 237, "gen", _D + "PCIE_LINK_GEN"),
    _field("pcie_link_generation_max", 235, "gen", _D + "PCIE_MAX_LINK_GEN"),
    _field("pcie_link_width", 238, "lanes", _D + "PCIE_LINK_WIDTH"),
    _field("pcie_link_width_max", 236, "lanes", _D + "PCIE_MAX_LINK_WIDTH"),
    # Deprecated since DCGM 3.3 (use PROF_PCIE_*_BYTES); 2.x default counters and 1.x served them.
    _field("pcie_tx_bytes_per_second", 200, "KB/s", _D + "PCIE_TX_THROUGHPUT", (), "dcgm_pcie_tx_throughput",
           multiply=KIB),
    _field("pcie_rx_bytes_per_second", 201, "KB/s", _D + "PCIE_RX_THROUGHPUT", (), "dcgm_pcie_rx_throughput",
           multiply=KIB),
    _field("nvlink_crc_flit_errors_total", 409, "count", _D + "NVLINK_CRC_FLIT_ERROR_TOTAL",
           _D + "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "dcgm_nvlink_flit_crc_error_count_total"),
    _field("nvlink_replay_errors_total", 429, "count", _D + "NVLINK_REPLAY_ERROR_TOTAL",
           _D + "NVLINK_REPLAY_ERROR_COUNT_TOTAL", "dcgm_nvlink_replay_error_count_total"),
    _field("nvlink_recovery_errors_total", 439, "count", _D + "NVLINK_RECOVERY_ERROR_TOTAL",
           _D + "NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "dcgm_nvlink_recovery_error_count_total"),
    _field("remapped_rows_pending", 396, "bool", _D + "ROW_REMAP_PENDING"),
    # Opt-in in dcgm-exporter's default counters (commented out there): read where a page serves them.
    # Clock violation time counters: nanoseconds the clocks were held below the application clocks, per policy.
    _field("power_violation_seconds_total", 240, "ns", _D + "POWER_VIOLATION", (), "dcgm_power_violation",
           divide=NANO),
    _field("thermal_violation_seconds_total", 241, "ns", _D + "THERMAL_VIOLATION", (),
           "dcgm_thermal_violation", divide=NANO),
    _field("sync_boost_violation_seconds_total", 242, "ns", _D + "SYNC_BOOST_VIOLATION", (),
           "dcgm_sync_boost_violation", divide=NANO),
    _field("board_limit_violation_seconds_total", 243, "ns", _D + "BOARD_LIMIT_VIOLATION", (),
           "dcgm_board_limit_violation", divide=NANO),
    _field("low_utilization_violation_seconds_total", 244, "ns", _D + "LOW_UTIL_VIOLATION", (),
           "dcgm_low_util_violation", divide=NANO),
    _field("reliability_violation_seconds_total", 245, "ns", _D + "RELIABILITY_VIOLATION", (),
           "dcgm_reliability_violation", divide=NANO),
    _field("ecc_corrected_errors_persistent_total", 312, "count", _D + "ECC_SBE_AGG_TOTAL", (),
           "dcgm_ecc_sbe_aggregate_total"),
    _field("ecc_uncorrected_errors_persistent_total", 313, "count", _D + "ECC_DBE_AGG_TOTAL", (),
           "dcgm_ecc_dbe_aggregate_total"),
    _field("retired_pages_single_bit_total", 390, "count", _D + "PAGE_RETIRED_SBE_TOTAL", _D + "RETIRED_SBE",
           "dcgm_retired_pages_sbe"),
    _field("retired_pages_double_bit_total", 391, "count", _D + "PAGE_RETIRED_DBE_TOTAL", _D + "RETIRED_DBE",
           "dcgm_retired_pages_dbe"),
    _field("retired_pages_pending", 392, "bool", _D + "PAGE_RETIRED_PENDING", _D + "RETIRED_PENDING",
           "dcgm_retired_pages_pending"),
    _field("nvlink_crc_data_errors_total", 419, "count", _D + "NVLINK_CRC_DATA_ERROR_TOTAL",
           _D + "NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "dcgm_nvlink_data_crc_error_count_total"),
    _field("sm_occupancy_ratio", 1003, "ratio", _P + "SM_OCCUPANCY_RATIO", _P + "SM_OCCUPANCY",
           "dcgm_fi_prof_sm_occupancy"),
    _field("fp64_active_ratio", 1006, "ratio", _P + "FP64_UTIL_RATIO", _P + "PIPE_FP64_ACTIVE"),
    _field("fp32_active_ratio", 1007, "ratio", _P + "FP32_UTIL_RATIO", _P + "PIPE_FP32_ACTIVE"),
    _field("fp16_active_ratio", 1008, "ratio", _P + "FP16_UTIL_RATIO", _P + "PIPE_FP16_ACTIVE"),
)
# fmt: on


@dataclass(frozen=True, slots=True)
class NameSpec:
    """What one exported name means: the field it belongs to and the generation of the name."""

    field: DcgmField
    name: DcgmName

    @property
    def target(self) -> str:
        return self.field.target


def _by_name() -> dict[str, NameSpec]:
    table: dict[str, NameSpec] = {}
    for row in FIELDS:
        for name in row.names:
            if name.name in table:
                raise AssertionError(f"{name.name} appears twice in the DCGM field table")
            table[name.name] = NameSpec(row, name)
    return table


BY_NAME: Final[Mapping[str, NameSpec]] = _by_name()

# --- a unit announced in HELP -------------------------------------------------------------------------------------

# Units a page may announce in a family's HELP text ("... (in Hz)."), as (dimension, factor to gpulens units).
# Only the base units of the dimensions whose DCGM unit is scaled: a HELP saying "(in Hz)" over a clock field is
# unambiguous, while other announcements are unreliable (1.x's DCP help texts say "(in %)" over 0-1 ratios).
_BASE_UNITS: Final = {"Hz": ("frequency", 1.0), "B": ("size", 1.0), "bytes": ("size", 1.0), "J": ("energy", 1.0)}
_SCALED_UNITS: Final = {"MHz": "frequency", "MiB": "size", "mJ": "energy"}
_HELP_UNIT_RE: Final = re.compile(r"\(in ([A-Za-z]+)\)")


def help_factor(row: DcgmField, help_text: str | None) -> float | None:
    """The factor to gpulens units when a family's HELP announces a base unit for a field DCGM scales, else None.

    For pages that write a field in base units under its DCGM name (``DCGM_FI_DEV_SM_CLOCK`` in Hz, announced
    "SM clock frequency (in Hz)."), as domain.md section 3 reports of dcgm-exporter 4.9.
    """
    match = _HELP_UNIT_RE.search(help_text or "")
    dimension = _SCALED_UNITS.get(row.unit)
    if match is None or dimension is None:
        return None
    base = _BASE_UNITS.get(match.group(1))
    return base[1] if base is not None and base[0] == dimension else None


# --- writing dcgm-exporter's names (--dcgm-compat) -----------------------------------------------------------------

COMPAT_FIELDS: Final[tuple[DcgmField, ...]] = tuple(row for row in FIELDS if row.compat_help)
COMPAT_LABELS: Final = (
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
    "container",
    "namespace",
    "pod",
)
# Written per MIG instance too (with GPU_I_PROFILE, GPU_I_ID): what a MigReading holds.
MIG_MEMORY_TARGETS: Final = frozenset({"memory_used_bytes", FREE})


def _reading_value(reading: GpuReading, target: str) -> float | int | bool | None:
    if target == FREE:
        if reading.memory_total_bytes is None or reading.memory_used_bytes is None:
            return None
        free = reading.memory_total_bytes - reading.memory_used_bytes - (reading.memory_reserved_bytes or 0)
        return max(free, 0)
    if target == NVLINK_TOTAL:
        if reading.nvlink_tx_bytes_per_second is None or reading.nvlink_rx_bytes_per_second is None:
            return None
        return reading.nvlink_tx_bytes_per_second + reading.nvlink_rx_bytes_per_second
    if target == MEM_COPY:  # DCGM recommends DRAM_ACTIVE over MEM_COPY_UTIL: the same quantity, better measured
        return reading.dram_active_ratio
    value: float | int | bool | None = getattr(reading, target)
    return value


def compat_value(row: DcgmField, reading: GpuReading, last_xid: Mapping[str, int]) -> float | int | None:
    """The value ``--dcgm-compat`` writes for ``row``, in the row's unit (``None``: not written).

    The XID row holds the last XID seen (0: none), from ``last_xid`` by GPU UUID, as an integer.
    """
    if row.target == XID_TARGET:
        return last_xid.get(reading.uuid, 0)
    value = _reading_value(reading, row.target)
    if value is None:
        return None
    return float(value) * row.divide / row.multiply


def mig_memory_value(row: DcgmField, mig: MigReading) -> float | None:
    """FB_USED / FB_FREE of one MIG instance, in the row's unit (``None``: unknown or another row)."""
    used, total = mig.memory_used_bytes, mig.memory_total_bytes
    if row.target == "memory_used_bytes" and used is not None:
        return float(used) * row.divide / row.multiply
    if row.target == FREE and used is not None and total is not None:
        return float(max(total - used, 0)) * row.divide / row.multiply
    return None


# --- dcgm-exporter's own series (no DCGM field id; gpulens.dcgmexp reads them) ------------------------------------

# XIDs seen per code within dcgm-exporter's window (--xid-count-window-size); label ``xid`` (``err_code`` accepted).
XID_COUNT_NAME: Final = "DCGM_EXP_XID_ERRORS_COUNT"
# Samples of DCGM field 112 within its window that had each clock-event reason; label ``clock_event``.
CLOCK_EVENTS_COUNT_NAME: Final = "DCGM_EXP_CLOCK_EVENTS_COUNT"
CLOCK_EVENT_BITS: Final[Mapping[str, int]] = {
    "gpu_idle": 0x1,
    "clocks_setting": 0x2,
    "power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clocks": 0x100,
}
# One series per DCGM health watch (label ``health_watch``), valued DCGM's result: 0 pass, 10 warn, 20 fail.
HEALTH_STATUS_NAME: Final = "DCGM_EXP_GPU_HEALTH_STATUS"
HEALTH_RESULTS: Final[Mapping[float, int]] = {0.0: 0, 10.0: 1, 20.0: 2}  # DCGM's result -> gpulens's 0 / 1 / 2
# One series per peer GPU (label ``peer_gpu``), valued 0 when peer-to-peer works ("OK"), else why not (1-6).
P2P_STATUS_NAME: Final = "DCGM_EXP_P2P_STATUS"
