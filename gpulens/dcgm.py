"""Parse a dcgm-exporter ``/metrics`` page into gpulens records.

``parse_dcgm_metrics`` is pure: Prometheus text in, ``DcgmParse`` out. It lives in the core because both the exporter's
``dcgm`` source and the collector (for ``kind = "dcgm"`` targets) read dcgm-exporter pages.

Rules (each one is a decision; the tests hold the code to them):

* **Text format.** Lines are split on ``\\n`` only (a trailing ``\\r`` is dropped, so CRLF works). Comments
  (``# HELP``, ``# TYPE``, anything else after ``#``) and blank lines are skipped; a malformed ``HELP``/``TYPE``
  line is bad. A sample is ``name[{labels}] value [timestamp]``; label values accept the escapes ``\\\\``, ``\\"``
  and ``\\n`` and nothing else; a repeated label name or a series (name and labels) seen twice is bad; values are
  decimal numbers, ``NaN`` or ``[+-]Inf``; the optional timestamp is an integer and is ignored. A bad line is
  counted by reason and skipped, never fatal.
* **Units are fixed by the metric name.** DCGM gives each unit its own field ID ("code that changes IDs must also
  change its value-type and scaling assumptions"), and dcgm-exporter names a series after its field. So a legacy
  name always carries the legacy unit and a base-unit name the base unit, whichever dcgm-exporter version wrote
  it: ``DCGM_FI_DEV_SM_CLOCK`` is MHz and ``DCGM_FI_DEV_SM_CLOCK_HERTZ`` is Hz; ``DCGM_FI_DEV_FB_USED`` is MiB
  and ``DCGM_FI_DEV_FB_USED_BYTES`` bytes; ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` is mJ and
  ``DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL`` J; ``DCGM_FI_DEV_GPU_UTIL`` is percent and ``..._GPU_UTIL_RATIO`` 0-1;
  ``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` and its 4.6 name ``DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL`` (one field,
  449) are MB/s (10^6 bytes/s) and ``DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND`` bytes/s. A value written in
  the wrong unit for its name lands outside the plausible range below and is dropped and counted, not stored.
* **Precedence.** When several names feed one field, the base-unit (4.6+/4.9) name wins over the legacy one, the
  enforced power limit over the management limit, and a GPU-level sample over a MIG instance's copy; among equals
  the first sample wins (a GPU shared by several pods repeats each value once per pod).
* **Sentinels.** DCGM's blank / not-found / not-supported / not-permissioned values are dropped (``None``) and
  counted as ``dcgm_sentinel``: any value >= ``DCGM_INT64_BLANK`` (0x7ffffffffffffff0), exactly
  ``DCGM_INT32_BLANK`` (0x7ffffff0) .. +3, and exactly ``DCGM_FP64_BLANK`` (2^47) .. +3. Only exact int32/fp64
  values are matched because a genuine counter (energy in mJ, say) may legitimately pass those magnitudes.
* **Plausibility.** After conversion every value must be finite, non-negative and inside a per-quantity range
  (ratios <= 1, temperatures <= 200 C, power <= 10 kW, clocks <= 100 GHz, rates <= 10 TB/s, memory <= 1 PiB,
  PCIe gen <= 16, width <= 64); integer fields must be whole. Anything else is ``dcgm_absurd_value``.
* **NVLink totals.** ``DCGM_FI_PROF_NVLINK_TX/RX_BYTES`` give tx/rx directly. Only when neither exists for a GPU,
  a total (``..._NVLINK_BANDWIDTH_TOTAL`` / ``..._THROUGHPUT_TOTAL`` / ``..._THROUGHPUT_BYTES_PER_SECOND``), which
  counts both directions, is split evenly into tx and rx: the sum stays right and a stall (traffic falling to
  zero) stays visible, while the split itself is an assumption.
* **Memory total.** ``FB_TOTAL`` / ``FB_CAPACITY_BYTES`` where exported, else used + free + reserved (reserved
  counted as 0 when absent), else ``None``.
* **MIG.** A sample with ``GPU_I_ID`` belongs to its parent GPU (``gpu``/``UUID``). Memory fields fill that
  instance's ``MigReading`` (its ``mig_uuid`` is ``MIG-<parent UUID>/<GPU_I_ID>``: dcgm-exporter exports no MIG
  UUID); utilization and profiling values are per instance and have no place on the parent, so they are not
  used; every other field is device-wide and fills the parent when no GPU-level sample did.
* **Identity.** ``gpu`` (index), ``UUID``, ``modelName``, ``pci_bus_id``. A known metric without a usable
  ``gpu``/``UUID`` is ``dcgm_bad_identity``. A UUID seen again with another index, or an index claimed by a
  second UUID, is a duplicate GPU: counted once per (UUID, index) as ``dcgm_duplicate_gpu``, later samples
  dropped. Samples of other DCGM entities (``nvswitch``, ``nvlink``/``link``, ``cpu``, ``cpucore`` labels) are
  ignored, as are names this module does not know.
* **Jobs.** Non-empty ``pod`` gives ``GpuJob(job_id="<namespace>/<pod>")`` (just ``<pod>`` without a
  namespace); non-empty ``hpc_job`` gives ``GpuJob(job_id=hpc_job)``.
* **Node.** The ``node`` argument, else the first ``hostname`` (4.6+) or ``Hostname`` label, else ``None``
  (records then carry ``fallback_node``; ``DcgmSource`` passes ``socket.gethostname()``).
* **XIDs.** ``DCGM_FI_DEV_XID_ERRORS`` / ``DCGM_FI_DEV_XID_ERROR`` hold the last XID seen (sticky), not a count.
  The parse reports that value per GPU; ``DcgmSource`` counts an event each time it changes to a non-zero code
  (43 -> 0 -> 43 counts twice; a missing read keeps the previous code). The first value seen after start-up
  counts once if it is non-zero: an XID still showing at start-up is evidence of a fault we should not hide,
  though it may predate the exporter. A repeat of the same code between two reads cannot be seen.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from gpulens.model import GpuJob, GpuReading, MigReading

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
    """True for DCGM's blank / not-found / not-supported / not-permissioned values (int64, int32 and fp64)."""
    return value >= _INT64_BLANK_FLOAT or value in _EXACT_SENTINELS


# --- the field table -----------------------------------------------------------------------------------------------

_Kind = Literal["float", "int", "bool"]


@dataclass(frozen=True, slots=True)
class _Quantity:
    kind: _Kind
    high: float


_RATIO = _Quantity("float", 1.0)
_BYTES = _Quantity("int", float(2**50))
_CELSIUS = _Quantity("float", 200.0)
_WATTS = _Quantity("float", 10_000.0)
_JOULES = _Quantity("float", 1e15)
_HERTZ = _Quantity("float", 1e11)
_RATE = _Quantity("float", 1e13)
_COUNT = _Quantity("int", float(2**63 - 1))
_PCIE_GEN = _Quantity("int", 16.0)
_PCIE_WIDTH = _Quantity("int", 64.0)
_FLAG = _Quantity("bool", 1.0)
_XID = _Quantity("int", float(2**31 - 1))

_MIB: Final = 1024 * 1024
_MEGA: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class _Field:
    target: str
    quantity: _Quantity
    multiply: float = 1
    divide: float = 1
    rank: int = 0  # higher wins when several names feed one target


def _legacy(target: str, quantity: _Quantity, *, multiply: float = 1, divide: float = 1) -> _Field:
    return _Field(target, quantity, multiply, divide, rank=0)


def _current(target: str, quantity: _Quantity) -> _Field:
    return _Field(target, quantity, rank=1)


# Targets that are not GpuReading fields: combined into real fields when records are built.
_FREE = "memory_free_bytes"
_NVLINK_TOTAL = "nvlink_total_bytes_per_second"
_XID_TARGET = "xid"

_P = "DCGM_FI_PROF_"
_D = "DCGM_FI_DEV_"
_FIELDS: Final[Mapping[str, _Field]] = {
    # utilization and profiling (0-1)
    _D + "GPU_UTIL": _legacy("utilization_ratio", _RATIO, divide=100),
    _D + "GPU_UTIL_RATIO": _current("utilization_ratio", _RATIO),
    _P + "SM_ACTIVE": _legacy("sm_active_ratio", _RATIO),
    _P + "SM_UTIL_RATIO": _current("sm_active_ratio", _RATIO),
    _P + "PIPE_TENSOR_ACTIVE": _legacy("tensor_active_ratio", _RATIO),
    _P + "TENSOR_UTIL_RATIO": _current("tensor_active_ratio", _RATIO),
    _P + "DRAM_ACTIVE": _legacy("dram_active_ratio", _RATIO),
    _P + "DRAM_UTIL_RATIO": _current("dram_active_ratio", _RATIO),
    # memory
    _D + "FB_USED": _legacy("memory_used_bytes", _BYTES, multiply=_MIB),
    _D + "FB_USED_BYTES": _current("memory_used_bytes", _BYTES),
    _D + "FB_FREE": _legacy(_FREE, _BYTES, multiply=_MIB),
    _D + "FB_FREE_BYTES": _current(_FREE, _BYTES),
    _D + "FB_RESERVED": _legacy("memory_reserved_bytes", _BYTES, multiply=_MIB),
    _D + "FB_RESERVED_BYTES": _current("memory_reserved_bytes", _BYTES),
    _D + "FB_TOTAL": _legacy("memory_total_bytes", _BYTES, multiply=_MIB),
    _D + "FB_CAPACITY_BYTES": _current("memory_total_bytes", _BYTES),
    # temperature
    _D + "GPU_TEMP": _legacy("temperature_celsius", _CELSIUS),
    _D + "GPU_TEMP_CELSIUS": _current("temperature_celsius", _CELSIUS),
    _D + "MEMORY_TEMP": _legacy("memory_temperature_celsius", _CELSIUS),
    _D + "MEMORY_TEMP_CELSIUS": _current("memory_temperature_celsius", _CELSIUS),
    _D + "SLOWDOWN_TEMP": _legacy("slowdown_temperature_celsius", _CELSIUS),
    _D + "GPU_TEMP_SLOWDOWN_CELSIUS": _current("slowdown_temperature_celsius", _CELSIUS),
    # power and energy
    _D + "POWER_USAGE": _legacy("power_watts", _WATTS),
    _D + "BOARD_POWER_WATTS": _current("power_watts", _WATTS),
    _D + "POWER_MGMT_LIMIT": _legacy("power_limit_watts", _WATTS),
    _D + "ENFORCED_POWER_LIMIT": _current("power_limit_watts", _WATTS),
    _D + "TOTAL_ENERGY_CONSUMPTION": _legacy("energy_joules_total", _JOULES, divide=1000),
    _D + "GPU_ENERGY_JOULES_TOTAL": _current("energy_joules_total", _JOULES),
    # clocks
    _D + "SM_CLOCK": _legacy("sm_clock_hertz", _HERTZ, multiply=_MEGA),
    _D + "SM_CLOCK_HERTZ": _current("sm_clock_hertz", _HERTZ),
    _D + "MEM_CLOCK": _legacy("memory_clock_hertz", _HERTZ, multiply=_MEGA),
    _D + "MEMORY_CLOCK_HERTZ": _current("memory_clock_hertz", _HERTZ),
    _D + "MAX_SM_CLOCK": _legacy("max_sm_clock_hertz", _HERTZ, multiply=_MEGA),
    _D + "SM_MAX_CLOCK_HERTZ": _current("max_sm_clock_hertz", _HERTZ),
    _D + "MAX_MEM_CLOCK": _legacy("max_memory_clock_hertz", _HERTZ, multiply=_MEGA),
    _D + "MEMORY_MAX_CLOCK_HERTZ": _current("max_memory_clock_hertz", _HERTZ),
    _D + "CLOCK_THROTTLE_REASONS": _legacy("throttle_reasons", _COUNT),
    _D + "CLOCKS_EVENT_REASONS": _current("throttle_reasons", _COUNT),
    # PCIe
    _P + "PCIE_TX_BYTES": _legacy("pcie_tx_bytes_per_second", _RATE),
    _P + "PCIE_RX_BYTES": _legacy("pcie_rx_bytes_per_second", _RATE),
    _D + "PCIE_LINK_GEN": _legacy("pcie_link_generation", _PCIE_GEN),
    _D + "PCIE_MAX_LINK_GEN": _legacy("pcie_link_generation_max", _PCIE_GEN),
    _D + "PCIE_LINK_WIDTH": _legacy("pcie_link_width", _PCIE_WIDTH),
    _D + "PCIE_MAX_LINK_WIDTH": _legacy("pcie_link_width_max", _PCIE_WIDTH),
    _D + "PCIE_REPLAY_COUNTER": _legacy("pcie_replays_total", _COUNT),
    _D + "PCIE_REPLAY_TOTAL": _current("pcie_replays_total", _COUNT),
    # NVLink
    _P + "NVLINK_TX_BYTES": _legacy("nvlink_tx_bytes_per_second", _RATE),
    _P + "NVLINK_RX_BYTES": _legacy("nvlink_rx_bytes_per_second", _RATE),
    _D + "NVLINK_BANDWIDTH_TOTAL": _legacy(_NVLINK_TOTAL, _RATE, multiply=_MEGA),
    _D + "NVLINK_THROUGHPUT_TOTAL": _legacy(_NVLINK_TOTAL, _RATE, multiply=_MEGA),
    _D + "NVLINK_THROUGHPUT_BYTES_PER_SECOND": _current(_NVLINK_TOTAL, _RATE),
    _D + "NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": _legacy("nvlink_crc_flit_errors_total", _COUNT),
    _D + "NVLINK_REPLAY_ERROR_COUNT_TOTAL": _legacy("nvlink_replay_errors_total", _COUNT),
    _D + "NVLINK_RECOVERY_ERROR_COUNT_TOTAL": _legacy("nvlink_recovery_errors_total", _COUNT),
    # ECC and row remapping
    _D + "ECC_SBE_VOL_TOTAL": _legacy("ecc_corrected_errors_total", _COUNT),
    _D + "ECC_DBE_VOL_TOTAL": _legacy("ecc_uncorrected_errors_total", _COUNT),
    _D + "CORRECTABLE_REMAPPED_ROWS": _legacy("remapped_rows_correctable", _COUNT),
    _D + "ROW_REMAP_CORRECTABLE_TOTAL": _current("remapped_rows_correctable", _COUNT),
    _D + "UNCORRECTABLE_REMAPPED_ROWS": _legacy("remapped_rows_uncorrectable", _COUNT),
    _D + "ROW_REMAP_UNCORRECTABLE_TOTAL": _current("remapped_rows_uncorrectable", _COUNT),
    _D + "ROW_REMAP_FAILURE": _legacy("remapped_rows_failure", _FLAG),
    _D + "ROW_REMAP_FAILED": _current("remapped_rows_failure", _FLAG),
    _D + "ROW_REMAP_PENDING": _legacy("remapped_rows_pending", _FLAG),
    # XID: the last one seen
    _D + "XID_ERRORS": _legacy(_XID_TARGET, _XID),
    _D + "XID_ERROR": _current(_XID_TARGET, _XID),
}

# Per MIG instance: these describe the instance, not the GPU.
_MIG_MEMORY_TARGETS: Final = frozenset({"memory_used_bytes", _FREE, "memory_reserved_bytes", "memory_total_bytes"})
_MIG_LOCAL_TARGETS: Final = _MIG_MEMORY_TARGETS | {
    "utilization_ratio",
    "sm_active_ratio",
    "tensor_active_ratio",
    "dram_active_ratio",
    "pcie_tx_bytes_per_second",
    "pcie_rx_bytes_per_second",
    "nvlink_tx_bytes_per_second",
    "nvlink_rx_bytes_per_second",
}
_NOT_READING_FIELDS: Final = frozenset({_FREE, _NVLINK_TOTAL, _XID_TARGET})
_OTHER_ENTITY_LABELS: Final = ("nvswitch", "nvlink", "link", "cpu", "cpucore")
_DRIVER_LABELS: Final = ("DCGM_FI_SYSTEM_DRIVER_VERSION", "DCGM_FI_DRIVER_VERSION")
_HOSTNAME_LABELS: Final = ("hostname", "Hostname")

# Error reasons (NodeSnapshot.errors keys).
BAD_LINES: Final = "dcgm_bad_lines"
SENTINEL: Final = "dcgm_sentinel"
ABSURD_VALUE: Final = "dcgm_absurd_value"
DUPLICATE_GPU: Final = "dcgm_duplicate_gpu"
BAD_IDENTITY: Final = "dcgm_bad_identity"
FETCH_FAILED: Final = "dcgm_fetch_failed"


# --- the Prometheus text format ------------------------------------------------------------------------------------

_NAME_RE: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_RE: Final = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"')
_SPLIT_RE: Final = re.compile(r"[ \t]+")
_ESCAPE_RE: Final = re.compile(r"\\(.)")
_VALUE_RE: Final = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?i:inf|infinity)|(?i:nan)")
_TIMESTAMP_RE: Final = re.compile(r"-?[0-9]+")
_INDEX_RE: Final = re.compile(r"[0-9]{1,9}")
_METRIC_TYPES: Final = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
_UNESCAPES: Final = {"\\": "\\", '"': '"', "n": "\n"}


class _BadLineError(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _Sample:
    name: str
    labels: dict[str, str]
    value: float


def _unescape_one(match: re.Match[str]) -> str:
    try:
        return _UNESCAPES[match.group(1)]
    except KeyError:
        raise _BadLineError("bad_escape") from None


def _skip_blanks(line: str, pos: int) -> int:
    while pos < len(line) and line[pos] in " \t":
        pos += 1
    return pos


def _parse_labels(line: str, pos: int) -> tuple[dict[str, str], int]:
    """Parse ``{...}`` starting just after the ``{``; returns the labels and the position after ``}``."""
    labels: dict[str, str] = {}
    while True:
        pos = _skip_blanks(line, pos)
        if line.startswith("}", pos):
            return labels, pos + 1
        match = _LABEL_RE.match(line, pos)
        if match is None:
            raise _BadLineError("bad_labels")
        name, raw = match.group(1), match.group(2)
        if name in labels:
            raise _BadLineError("duplicate_label")
        labels[name] = _ESCAPE_RE.sub(_unescape_one, raw) if "\\" in raw else raw
        pos = _skip_blanks(line, match.end())
        if line.startswith(",", pos):
            pos += 1
        elif not line.startswith("}", pos):
            raise _BadLineError("bad_labels")


def _parse_comment(line: str) -> None:
    parts = _SPLIT_RE.split(line[1:].strip(" \t"), maxsplit=2)
    if parts[0] not in ("HELP", "TYPE"):
        return
    if len(parts) < 2 or not _NAME_RE.fullmatch(parts[1]):
        raise _BadLineError("bad_comment")
    if parts[0] == "TYPE" and (len(parts) != 3 or parts[2] not in _METRIC_TYPES):
        raise _BadLineError("bad_comment")


def _parse_line(raw: str) -> _Sample | None:
    """One line -> a sample, or ``None`` for a blank or comment line. Raises ``_BadLineError``."""
    line = raw.removesuffix("\r").strip(" \t")
    if not line:
        return None
    if line.startswith("#"):
        _parse_comment(line)
        return None
    match = _NAME_RE.match(line)
    if match is None:
        raise _BadLineError("bad_name")
    name, pos = match.group(), match.end()
    labels: dict[str, str] = {}
    if line.startswith("{", pos):
        labels, pos = _parse_labels(line, pos + 1)
    elif pos < len(line) and line[pos] not in " \t":
        raise _BadLineError("bad_name")
    tokens = _SPLIT_RE.split(line[pos:].strip(" \t"))
    if not _VALUE_RE.fullmatch(tokens[0]):
        raise _BadLineError("bad_value")
    if len(tokens) > 2:
        raise _BadLineError("trailing_garbage")
    if len(tokens) == 2 and not _TIMESTAMP_RE.fullmatch(tokens[1]):
        raise _BadLineError("bad_timestamp")
    return _Sample(name, labels, float(tokens[0]))


# --- building records ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DcgmParse:
    """What one dcgm-exporter page held, in gpulens records and units."""

    node: str | None
    gpus: tuple[GpuReading, ...]
    migs: tuple[MigReading, ...]
    jobs: tuple[GpuJob, ...]
    driver_version: str | None
    # GPU UUID -> the last XID DCGM reported (0: none); DcgmSource turns it into counters.
    last_xid: Mapping[str, int]
    samples: int  # well-formed sample lines, known names or not
    bad_lines: int
    bad_line_reasons: Mapping[str, int]  # e.g. "bad_labels", "bad_value", "duplicate_series"
    first_bad_line: int | None  # 1-based line number, for the log
    # Sample-level problems by NodeSnapshot error reason (dcgm_sentinel, dcgm_absurd_value, ...).
    problems: Mapping[str, int]

    def error_counts(self) -> dict[str, int]:
        """This page's problems keyed as in ``NodeSnapshot.errors`` (zero counts left out)."""
        counts = {BAD_LINES: self.bad_lines, **self.problems}
        return {reason: n for reason, n in counts.items() if n}


_Priority = tuple[bool, int]  # (from a GPU-level sample, rank of the name)
_Value = float | int | bool


@dataclass(slots=True)
class _Values:
    """Field values of one GPU or MIG instance, each with the priority of the sample that gave it."""

    items: dict[str, tuple[_Priority, _Value]] = field(default_factory=dict)

    def offer(self, target: str, priority: _Priority, value: _Value) -> None:
        held = self.items.get(target)
        if held is None or priority > held[0]:
            self.items[target] = (priority, value)

    def get(self, target: str) -> Any:
        held = self.items.get(target)
        return None if held is None else held[1]


@dataclass(slots=True)
class _Mig:
    profile: str | None
    values: _Values = field(default_factory=_Values)


@dataclass(slots=True)
class _Gpu:
    index: int
    uuid: str
    model: str | None = None
    pci_bus_id: str | None = None
    driver_version: str | None = None
    values: _Values = field(default_factory=_Values)
    migs: dict[int, _Mig] = field(default_factory=dict)


def _convert(spec: _Field, raw: float) -> _Value | str:
    """The value in our units, or the problem reason (a ``str``) when it must be dropped."""
    if not math.isfinite(raw):
        return ABSURD_VALUE
    if is_dcgm_sentinel(raw):
        return SENTINEL
    value = raw * spec.multiply / spec.divide + 0.0  # + 0.0 turns -0.0 into 0.0
    quantity = spec.quantity
    if not 0.0 <= value <= quantity.high:
        return ABSURD_VALUE
    if quantity.kind == "float":
        return value
    if not value.is_integer():
        return ABSURD_VALUE
    return int(value) if quantity.kind == "int" else value == 1.0


def _memory_total(values: _Values) -> int | None:
    total: int | None = values.get("memory_total_bytes")
    if total is not None:
        return total
    used, free = values.get("memory_used_bytes"), values.get(_FREE)
    if used is None or free is None:
        return None
    return int(used + free + (values.get("memory_reserved_bytes") or 0))


class _Builder:
    """Accumulates samples into per-GPU state, then builds the records."""

    def __init__(self) -> None:
        self.gpus: dict[str, _Gpu] = {}
        self.index_owner: dict[int, str] = {}
        self.duplicates: set[tuple[str, int]] = set()
        self.jobs: dict[tuple[str, str], int] = {}  # (UUID, job id) -> GPU index, in order of appearance
        self.hostname: str | None = None
        self.driver_version: str | None = None
        self.problems: dict[str, int] = {}

    def problem(self, reason: str) -> None:
        self.problems[reason] = self.problems.get(reason, 0) + 1

    def add(self, sample: _Sample) -> None:
        labels = sample.labels
        if self.hostname is None:
            self.hostname = next((labels[k] for k in _HOSTNAME_LABELS if labels.get(k)), None)
        spec = _FIELDS.get(sample.name)
        if spec is None or any(k in labels for k in _OTHER_ENTITY_LABELS):
            return
        instance = labels.get("GPU_I_ID", "")
        if instance and not _INDEX_RE.fullmatch(instance):
            self.problem(BAD_IDENTITY)
            return
        gpu = self._gpu_for(labels)
        if gpu is None:
            return
        self._note_jobs(gpu, labels)
        mig = self._mig(gpu, int(instance), labels) if instance else None
        value = _convert(spec, sample.value)
        if isinstance(value, str):
            self.problem(value)
        elif mig is None:
            gpu.values.offer(spec.target, (True, spec.rank), value)
        else:
            if spec.target in _MIG_MEMORY_TARGETS:
                mig.values.offer(spec.target, (True, spec.rank), value)
            if spec.target not in _MIG_LOCAL_TARGETS:
                gpu.values.offer(spec.target, (False, spec.rank), value)

    def _gpu_for(self, labels: Mapping[str, str]) -> _Gpu | None:
        index_text, uuid = labels.get("gpu", ""), labels.get("UUID", "")
        if not uuid or not _INDEX_RE.fullmatch(index_text):
            self.problem(BAD_IDENTITY)
            return None
        index = int(index_text)
        gpu = self.gpus.get(uuid)
        if gpu is None and index not in self.index_owner:
            gpu = self.gpus[uuid] = _Gpu(index, uuid)
            self.index_owner[index] = uuid
        elif gpu is None or gpu.index != index:
            if (uuid, index) not in self.duplicates:
                self.duplicates.add((uuid, index))
                self.problem(DUPLICATE_GPU)
            return None
        gpu.model = gpu.model or labels.get("modelName") or None
        gpu.pci_bus_id = gpu.pci_bus_id or labels.get("pci_bus_id") or None
        driver = next((labels[k] for k in _DRIVER_LABELS if labels.get(k)), None)
        gpu.driver_version = gpu.driver_version or driver
        self.driver_version = self.driver_version or driver
        return gpu

    @staticmethod
    def _mig(gpu: _Gpu, instance: int, labels: Mapping[str, str]) -> _Mig:
        mig = gpu.migs.get(instance)
        if mig is None:
            mig = gpu.migs[instance] = _Mig(labels.get("GPU_I_PROFILE") or None)
        return mig

    def _note_jobs(self, gpu: _Gpu, labels: Mapping[str, str]) -> None:
        pod, namespace, hpc_job = labels.get("pod", ""), labels.get("namespace", ""), labels.get("hpc_job", "")
        if pod:
            job_id = f"{namespace}/{pod}" if namespace else pod
            self.jobs.setdefault((gpu.uuid, job_id), gpu.index)
        if hpc_job:
            self.jobs.setdefault((gpu.uuid, hpc_job), gpu.index)

    def _reading(self, gpu: _Gpu, node: str, timestamp: float) -> GpuReading:
        fields: dict[str, Any] = {
            target: value for target, (_, value) in gpu.values.items.items() if target not in _NOT_READING_FIELDS
        }
        fields["memory_total_bytes"] = _memory_total(gpu.values)
        total = gpu.values.get(_NVLINK_TOTAL)
        no_direction = "nvlink_tx_bytes_per_second" not in fields and "nvlink_rx_bytes_per_second" not in fields
        if total is not None and no_direction:
            fields["nvlink_tx_bytes_per_second"] = fields["nvlink_rx_bytes_per_second"] = total / 2
        return GpuReading(
            node=node,
            gpu=gpu.index,
            uuid=gpu.uuid,
            model=gpu.model or "unknown",
            timestamp=timestamp,
            pci_bus_id=gpu.pci_bus_id,
            driver_version=gpu.driver_version,
            mig_enabled=True if gpu.migs else None,
            **fields,
        )

    def finish(self, *, node: str | None, timestamp: float, fallback_node: str, parse: _LineStats) -> DcgmParse:
        resolved = node or self.hostname
        record_node = resolved or fallback_node
        gpus = sorted(self.gpus.values(), key=lambda g: g.index)
        migs = [
            MigReading(
                node=record_node,
                gpu=gpu.index,
                uuid=gpu.uuid,
                mig_uuid=f"MIG-{gpu.uuid}/{instance}",
                gpu_instance_id=instance,
                profile=mig.profile,
                memory_used_bytes=mig.values.get("memory_used_bytes"),
                memory_total_bytes=_memory_total(mig.values),
            )
            for gpu in gpus
            for instance, mig in sorted(gpu.migs.items())
        ]
        jobs = [
            GpuJob(node=record_node, gpu=index, uuid=uuid, job_id=job_id) for (uuid, job_id), index in self.jobs.items()
        ]
        return DcgmParse(
            node=resolved,
            gpus=tuple(self._reading(gpu, record_node, timestamp) for gpu in gpus),
            migs=tuple(migs),
            jobs=tuple(jobs),
            driver_version=self.driver_version,
            last_xid={g.uuid: g.values.get(_XID_TARGET) for g in gpus if g.values.get(_XID_TARGET) is not None},
            samples=parse.samples,
            bad_lines=sum(parse.bad_reasons.values()),
            bad_line_reasons=dict(parse.bad_reasons),
            first_bad_line=parse.first_bad_line,
            problems=dict(self.problems),
        )


@dataclass(slots=True)
class _LineStats:
    samples: int = 0
    bad_reasons: dict[str, int] = field(default_factory=dict)
    first_bad_line: int | None = None
    series: set[tuple[str, tuple[tuple[str, str], ...]]] = field(default_factory=set)

    def bad(self, reason: str, lineno: int) -> None:
        self.bad_reasons[reason] = self.bad_reasons.get(reason, 0) + 1
        if self.first_bad_line is None:
            self.first_bad_line = lineno


def parse_dcgm_metrics(text: str, *, node: str | None, timestamp: float, fallback_node: str = "") -> DcgmParse:
    """Parse a dcgm-exporter ``/metrics`` page. Never raises on bad content: bad lines are counted and skipped.

    ``node`` overrides the hostname label; records carry ``fallback_node`` when neither names the node.
    """
    builder = _Builder()
    stats = _LineStats()
    for lineno, raw in enumerate(text.split("\n"), start=1):
        try:
            sample = _parse_line(raw)
        except _BadLineError as bad:
            stats.bad(bad.reason, lineno)
            continue
        if sample is None:
            continue
        key = (sample.name, tuple(sorted(sample.labels.items())))
        if key in stats.series:
            stats.bad("duplicate_series", lineno)
            continue
        stats.series.add(key)
        stats.samples += 1
        builder.add(sample)
    return builder.finish(node=node, timestamp=timestamp, fallback_node=fallback_node, parse=stats)
