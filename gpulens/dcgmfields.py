"""The DCGM field table: each DCGM field gpulens reads or writes, its names by dcgm-exporter generation and its units.

One row per DCGM field (``DcgmField``): the ``GpuReading`` field it feeds, its DCGM field id (``dcgm_fields.h``), and
every name dcgm-exporter has exported it under, each with the factor from that name's unit to gpulens's units:

* **2.x-4.5 names** (``legacy``) in DCGM's historical units: ``DCGM_FI_DEV_SM_CLOCK`` MHz, ``DCGM_FI_DEV_FB_USED``
  MiB, ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` mJ, ``DCGM_FI_DEV_GPU_UTIL`` percent,
  ``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` MB/s (10^6 bytes/s).
* **4.6+ names** (``base``) in base units: ``..._SM_CLOCK_HERTZ`` Hz, ``..._FB_USED_BYTES`` bytes,
  ``..._GPU_ENERGY_JOULES_TOTAL`` J, ``..._GPU_UTIL_RATIO`` 0-1, ``..._NVLINK_THROUGHPUT_BYTES_PER_SECOND`` bytes/s.

DCGM gives each unit its own field id ("code that changes IDs must also change its value-type and scaling
assumptions") and dcgm-exporter names a series after its field, so a name always carries the unit of its row here,
whichever dcgm-exporter version wrote it. dcgm-exporter 1.x and ``--use-old-namespace`` names (``dcgm_gpu_temp``...)
are not read. The ``field_id`` is that of the 2.x-4.5 name (where DCGM later renamed a field, the id stayed).

The same rows define the ``--dcgm-compat`` families the exporter writes: a row with ``compat_help`` is written under
its first 2.x-4.5 name, converted back to that name's unit, in the order of the table.

Also here: DCGM's blank sentinels and the plausible range of each quantity, both used when reading a page.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from gpulens.model import GpuReading

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


# --- quantities: value kind and plausible range, in gpulens units --------------------------------------------------

Kind = Literal["float", "int", "bool"]


@dataclass(frozen=True, slots=True)
class Quantity:
    """The kind of a value and its largest plausible value (the smallest is 0)."""

    kind: Kind
    high: float


RATIO: Final = Quantity("float", 1.0)
BYTES: Final = Quantity("int", float(2**50))
CELSIUS: Final = Quantity("float", 200.0)
WATTS: Final = Quantity("float", 10_000.0)
JOULES: Final = Quantity("float", 1e15)
HERTZ: Final = Quantity("float", 1e11)
RATE: Final = Quantity("float", 1e13)
COUNT: Final = Quantity("int", float(2**63 - 1))
PCIE_GEN: Final = Quantity("int", 16.0)
PCIE_WIDTH: Final = Quantity("int", 64.0)
FLAG: Final = Quantity("bool", 1.0)
XID: Final = Quantity("int", float(2**31 - 1))

MIB: Final = 1024 * 1024
MEGA: Final = 1_000_000

# Targets that are not GpuReading fields: combined into real fields when records are built.
FREE: Final = "memory_free_bytes"
NVLINK_TOTAL: Final = "nvlink_total_bytes_per_second"
XID_TARGET: Final = "xid"


# --- the table -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DcgmName:
    """One exported name of a field: gpulens value = exported value * ``multiply`` / ``divide``.

    ``rank``: when several names feed one target, the higher rank wins (base-unit names over legacy ones, the
    enforced power limit over the management limit).
    """

    name: str
    multiply: float = 1
    divide: float = 1
    rank: int = 0


@dataclass(frozen=True, slots=True)
class DcgmField:
    """One DCGM field: the target it feeds, its quantity and id, its names, and its ``--dcgm-compat`` HELP text."""

    target: str
    quantity: Quantity
    field_id: int
    legacy: tuple[DcgmName, ...] = ()  # dcgm-exporter 2.x-4.5 names, in DCGM's historical unit
    base: tuple[DcgmName, ...] = ()  # dcgm-exporter 4.6+ names, in base units
    compat_help: str | None = None  # written by --dcgm-compat under legacy[0].name when set

    @property
    def names(self) -> tuple[DcgmName, ...]:
        return self.legacy + self.base


def _field(
    target: str,
    quantity: Quantity,
    field_id: int,
    legacy: str | tuple[str, ...] = (),
    base: str | None = None,
    *,
    multiply: float = 1,
    divide: float = 1,
    rank: int = 0,
    compat: str | None = None,
) -> DcgmField:
    legacy_names = (legacy,) if isinstance(legacy, str) else legacy
    return DcgmField(
        target,
        quantity,
        field_id,
        tuple(DcgmName(name, multiply, divide, rank) for name in legacy_names),
        () if base is None else (DcgmName(base, rank=rank + 1),),
        compat,
    )


_P = "DCGM_FI_PROF_"
_D = "DCGM_FI_DEV_"

# In the order --dcgm-compat writes its families (dcgm-exporter's default counters first).
# fmt: off
FIELDS: Final[tuple[DcgmField, ...]] = (
    _field("utilization_ratio", RATIO, 203, _D + "GPU_UTIL", _D + "GPU_UTIL_RATIO", divide=100,
           compat="GPU utilization (in %)."),
    _field("memory_used_bytes", BYTES, 252, _D + "FB_USED", _D + "FB_USED_BYTES", multiply=MIB,
           compat="Framebuffer memory used (in MiB)."),
    _field(FREE, BYTES, 251, _D + "FB_FREE", _D + "FB_FREE_BYTES", multiply=MIB,
           compat="Framebuffer memory free (in MiB)."),
    _field("temperature_celsius", CELSIUS, 150, _D + "GPU_TEMP", _D + "GPU_TEMP_CELSIUS",
           compat="GPU temperature (in C)."),
    _field("memory_temperature_celsius", CELSIUS, 140, _D + "MEMORY_TEMP", _D + "MEMORY_TEMP_CELSIUS",
           compat="Memory temperature (in C)."),
    _field("power_watts", WATTS, 155, _D + "POWER_USAGE", _D + "BOARD_POWER_WATTS", compat="Power draw (in W)."),
    _field("energy_joules_total", JOULES, 156, _D + "TOTAL_ENERGY_CONSUMPTION", _D + "GPU_ENERGY_JOULES_TOTAL",
           divide=1000, compat="Total energy consumption since boot (in mJ)."),
    _field("sm_clock_hertz", HERTZ, 100, _D + "SM_CLOCK", _D + "SM_CLOCK_HERTZ", multiply=MEGA,
           compat="SM clock frequency (in MHz)."),
    _field("memory_clock_hertz", HERTZ, 101, _D + "MEM_CLOCK", _D + "MEMORY_CLOCK_HERTZ", multiply=MEGA,
           compat="Memory clock frequency (in MHz)."),
    _field("pcie_replays_total", COUNT, 202, _D + "PCIE_REPLAY_COUNTER", _D + "PCIE_REPLAY_TOTAL",
           compat="Total number of PCIe retries."),
    _field("ecc_corrected_errors_total", COUNT, 310, _D + "ECC_SBE_VOL_TOTAL",
           compat="Total number of single-bit volatile ECC errors."),
    _field("ecc_uncorrected_errors_total", COUNT, 311, _D + "ECC_DBE_VOL_TOTAL",
           compat="Total number of double-bit volatile ECC errors."),
    # Both directions summed; DCGM 4.6 renamed the field (449) NVLINK_THROUGHPUT_TOTAL, still in MB/s.
    _field(NVLINK_TOTAL, RATE, 449, (_D + "NVLINK_BANDWIDTH_TOTAL", _D + "NVLINK_THROUGHPUT_TOTAL"),
           _D + "NVLINK_THROUGHPUT_BYTES_PER_SECOND", multiply=MEGA,
           compat="Total number of NVLink bandwidth counters for all lanes (in MB/s)."),
    _field("pcie_tx_bytes_per_second", RATE, 1009, _P + "PCIE_TX_BYTES",
           compat="The rate of data transmitted over the PCIe bus (in B/s)."),
    _field("pcie_rx_bytes_per_second", RATE, 1010, _P + "PCIE_RX_BYTES",
           compat="The rate of data received over the PCIe bus (in B/s)."),
    _field("nvlink_tx_bytes_per_second", RATE, 1011, _P + "NVLINK_TX_BYTES",
           compat="The rate of data transmitted over NVLink (in B/s)."),
    _field("nvlink_rx_bytes_per_second", RATE, 1012, _P + "NVLINK_RX_BYTES",
           compat="The rate of data received over NVLink (in B/s)."),
    _field("sm_active_ratio", RATIO, 1002, _P + "SM_ACTIVE", _P + "SM_UTIL_RATIO",
           compat="The ratio of cycles an SM has at least 1 warp assigned."),
    _field("tensor_active_ratio", RATIO, 1004, _P + "PIPE_TENSOR_ACTIVE", _P + "TENSOR_UTIL_RATIO",
           compat="Ratio of cycles the tensor (HMMA) pipe is active."),
    _field("dram_active_ratio", RATIO, 1005, _P + "DRAM_ACTIVE", _P + "DRAM_UTIL_RATIO",
           compat="Ratio of cycles the device memory interface is active."),
    # XID: the last one seen (sticky), not a count; --dcgm-compat writes it after the others.
    _field(XID_TARGET, XID, 230, _D + "XID_ERRORS", _D + "XID_ERROR",
           compat="Value of the last XID error encountered."),
    # Read only.
    _field("memory_reserved_bytes", BYTES, 253, _D + "FB_RESERVED", _D + "FB_RESERVED_BYTES", multiply=MIB),
    _field("memory_total_bytes", BYTES, 250, _D + "FB_TOTAL", _D + "FB_CAPACITY_BYTES", multiply=MIB),
    _field("slowdown_temperature_celsius", CELSIUS, 158, _D + "SLOWDOWN_TEMP", _D + "GPU_TEMP_SLOWDOWN_CELSIUS"),
    _field("power_limit_watts", WATTS, 160, _D + "POWER_MGMT_LIMIT"),
    _field("power_limit_watts", WATTS, 164, _D + "ENFORCED_POWER_LIMIT", rank=1),  # the enforced limit wins
    _field("max_sm_clock_hertz", HERTZ, 113, _D + "MAX_SM_CLOCK", _D + "SM_MAX_CLOCK_HERTZ", multiply=MEGA),
    _field("max_memory_clock_hertz", HERTZ, 114, _D + "MAX_MEM_CLOCK", _D + "MEMORY_MAX_CLOCK_HERTZ", multiply=MEGA),
    _field("throttle_reasons", COUNT, 112, _D + "CLOCK_THROTTLE_REASONS", _D + "CLOCKS_EVENT_REASONS"),
    _field("pcie_link_generation", PCIE_GEN, 237, _D + "PCIE_LINK_GEN"),
    _field("pcie_link_generation_max", PCIE_GEN, 235, _D + "PCIE_MAX_LINK_GEN"),
    _field("pcie_link_width", PCIE_WIDTH, 238, _D + "PCIE_LINK_WIDTH"),
    _field("pcie_link_width_max", PCIE_WIDTH, 236, _D + "PCIE_MAX_LINK_WIDTH"),
    _field("nvlink_crc_flit_errors_total", COUNT, 409, _D + "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
    _field("nvlink_replay_errors_total", COUNT, 429, _D + "NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    _field("nvlink_recovery_errors_total", COUNT, 439, _D + "NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
    _field("remapped_rows_correctable", COUNT, 394, _D + "CORRECTABLE_REMAPPED_ROWS",
           _D + "ROW_REMAP_CORRECTABLE_TOTAL"),
    _field("remapped_rows_uncorrectable", COUNT, 393, _D + "UNCORRECTABLE_REMAPPED_ROWS",
           _D + "ROW_REMAP_UNCORRECTABLE_TOTAL"),
    _field("remapped_rows_failure", FLAG, 395, _D + "ROW_REMAP_FAILURE", _D + "ROW_REMAP_FAILED"),
    _field("remapped_rows_pending", FLAG, 396, _D + "ROW_REMAP_PENDING"),
)
# fmt: on


@dataclass(frozen=True, slots=True)
class NameSpec:
    """What one exported name means: the field it belongs to and its conversion to gpulens units."""

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

# --- writing dcgm-exporter's names (--dcgm-compat) -----------------------------------------------------------------

COMPAT_FIELDS: Final[tuple[DcgmField, ...]] = tuple(row for row in FIELDS if row.compat_help and row.legacy)
COMPAT_LABELS: Final = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")


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
    value: float | int | bool | None = getattr(reading, target)
    return value


def compat_value(row: DcgmField, reading: GpuReading, last_xid: Mapping[str, int]) -> float | int | None:
    """The value ``--dcgm-compat`` writes for ``row``, in the unit of its 2.x-4.5 name (``None``: not written).

    The XID row holds the last XID seen (0: none), from ``last_xid`` by GPU UUID, as an integer.
    """
    if row.target == XID_TARGET:
        return last_xid.get(reading.uuid, 0)
    value = _reading_value(reading, row.target)
    if value is None:
        return None
    unit = row.legacy[0]
    return float(value) * unit.divide / unit.multiply
