"""What storage can hold: each numeric field's SQL integer type and scaled encoding, and the bounds that follow.

The one table of the encodings: ``gpulens.storage.schema`` builds its columns from ``encoding`` and the column types
named here, and the readers at the door (the collector's scrape, the dcgm-exporter page reader) reject a value this
module says cannot be stored, so no value reaches a write that would fail it. A ``GpuReading`` field of ``float``
type is stored as ``round(value * per_unit / unit)`` in its SQL type (``power_watts`` as deciwatts in an
``integer``); an ``int`` byte count in KiB; any other ``int`` as it is. ``si_max`` is the largest SI value each
holds. A value above it is dropped alone (``None``, counted as ``value_out_of_range``); a GPU index above the
``gpu.gpu_index`` column's range, a link above ``nvlink_down.link``'s, a pid above ``process_latest.pid``'s, take
their record with them (``gpu_index_out_of_range``, ``link_out_of_range``, ``pid_out_of_range``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import Any, Final

from gpulens.metriccatalogue import GPU_FIELDS
from gpulens.model import GpuReading, LinkReading, ProcessReading

# The SQL integer types storage uses, with the largest value each holds (PostgreSQL; SQLite's integers are 64-bit).
SQL_INT_MAX: Final = {"smallint": 2**15 - 1, "integer": 2**31 - 1, "bigint": 2**63 - 1}

# The stored units: (SI suffix, stored suffix, SQL type, unit, per_unit) for float fields. A stored column is the
# field's name with its SI suffix replaced by the stored one; other fields (counts, flags) are stored as they are.
# Each type is the narrowest that holds the field's plausible range (0.1 W up to 214 kW, MHz up to 32 GHz, kB/s up to
# 2.1 TB/s): PostgreSQL stores smallint in 2 bytes, integer in 4, bigint in 8 (SQLite sizes each value by itself).
STORED_UNITS: Final = (
    ("_ratio", "_per10k", "smallint", 1, 10_000),  # ten-thousandths
    ("_celsius", "_decicelsius", "smallint", 1, 10),  # 0.1 degree
    ("_watts", "_deciwatts", "integer", 1, 10),
    ("_joules_total", "_millijoules_total", "bigint", 1, 1000),
    ("_hertz", "_mhz", "smallint", 1_000_000, 1),  # MHz, NVML's own resolution
    ("_bytes_per_second", "_kb_per_second", "integer", 1000, 1),  # kB/s (1000 B/s), NVML's own resolution
    ("_seconds_total", "_ms_total", "bigint", 1, 1000),  # time counters, in milliseconds
)
KIB_SUFFIX: Final = ("_bytes", "_kib")  # integer byte counts are stored in KiB, up to 2 TiB
# Fields whose range needs more than their suffix's type: a GPU's NVLink throughput passes 2.1 TB/s (NVLink 5).
WIDE_FIELDS: Final = frozenset({"nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second"})

# The identity columns of the tables beside the samples (storage.schema declares them with these types).
GPU_INDEX_TYPE: Final = "smallint"  # gpu.gpu_index
LINK_TYPE: Final = "smallint"  # nvlink_down.link
PID_TYPE: Final = "integer"  # process_latest.pid
BYTES_TYPE: Final = "bigint"  # process_latest.memory_used_bytes
GPU_INDEX_MAX: Final = SQL_INT_MAX[GPU_INDEX_TYPE]
# GPUs one target may report (a node has 4 to 16; a page or snapshot with more is cut to its first GPUS_PER_TARGET,
# the rest counted as gpu_limit): a 4 MiB page can name 84,331 GPUs for one node.
GPUS_PER_TARGET: Final = 1024
GPU_LIMIT: Final = "gpu_limit"

# Reasons counted when a value or record is rejected here.
VALUE_OUT_OF_RANGE: Final = "value_out_of_range"
GPU_INDEX_OUT_OF_RANGE: Final = "gpu_index_out_of_range"
LINK_OUT_OF_RANGE: Final = "link_out_of_range"
PID_OUT_OF_RANGE: Final = "pid_out_of_range"


@dataclass(frozen=True, slots=True)
class Encoding:
    """How one numeric field is stored: SI value = stored * unit / per_unit, in an SQL integer type."""

    name: str
    column: str
    sql_type: str  # a key of SQL_INT_MAX
    unit: int = 1
    per_unit: int = 1
    is_bool: bool = False
    is_int: bool = False  # the GpuReading field is an int

    @property
    def limit(self) -> int:
        """The largest stored integer."""
        return SQL_INT_MAX[self.sql_type]

    @property
    def si_max(self) -> float:
        """The largest SI value that encodes into the column (``math.inf`` for a flag)."""
        return math.inf if self.is_bool else self.limit * self.unit / self.per_unit


def encoding(name: str, annotation: str, kind: str) -> Encoding:
    """The encoding of the ``GpuReading`` field ``name`` of type ``annotation`` and ``kind`` (gauge, counter,
    bitmask). Raises ``TypeError`` when there is none."""
    if annotation in ("bool", "bool | None"):
        return Encoding(name, name, "smallint", is_bool=True)
    if annotation == "int | None":
        si_suffix, stored_suffix = KIB_SUFFIX
        if name.endswith(si_suffix):
            return Encoding(name, name.removesuffix(si_suffix) + stored_suffix, "integer", unit=1024, is_int=True)
        # Error counters fit 32 bits (NVML's PCIe replay counter is 32 bits); link states and row counts 16.
        return Encoding(name, name, "integer" if kind in ("counter", "bitmask") else "smallint", is_int=True)
    for si_suffix, stored_suffix, sql_type, unit, per_unit in STORED_UNITS:
        if annotation == "float | None" and name.endswith(si_suffix):
            column = name.removesuffix(si_suffix) + stored_suffix
            return Encoding(name, column, "bigint" if name in WIDE_FIELDS else sql_type, unit, per_unit)
    raise TypeError(f"no storage encoding for GpuReading.{name} ({annotation}): add one in gpulens/storedrange.py")


_ANNOTATIONS: Final = {f.name: str(f.type) for f in dataclasses.fields(GpuReading)}
# Every numeric GpuReading field that is stored, by name (``up`` and the catalogue's; ``throttle_reasons`` a bitmask).
ENCODINGS: Final[dict[str, Encoding]] = {
    name: encoding(name, _ANNOTATIONS[name], kind)
    for name, kind in (
        ("up", "gauge"),
        *((spec.field, spec.type) for spec in GPU_FIELDS),
        ("throttle_reasons", "bitmask"),
    )
}


def _bound_groups() -> tuple[tuple[float, Callable[[GpuReading], tuple[Any, ...]], tuple[str, ...]], ...]:
    """The bounded fields grouped by bound: one C-level getter per group, for checks over many readings."""
    by_bound: dict[float, list[str]] = {}
    for name, enc in ENCODINGS.items():
        if not enc.is_bool:
            by_bound.setdefault(enc.si_max, []).append(name)
    # attrgetter of one name gives the value, not a tuple: name it twice
    return tuple(
        (bound, attrgetter(*names, *names[:1]) if len(names) == 1 else attrgetter(*names), tuple(names))
        for bound, names in sorted(by_bound.items())
    )


_GROUPS: Final = _bound_groups()
_GPU: Final = attrgetter("gpu")
_LINK: Final = attrgetter("link")


def storable(name: str, value: float) -> bool:
    """Whether ``value`` of the field ``name`` fits its column (a field not stored here always fits)."""
    enc = ENCODINGS.get(name)
    return enc is None or abs(value) <= enc.si_max


def all_storable(readings: Sequence[GpuReading]) -> bool:
    """Whether every non-negative value of every reading fits its column: one pass in C per group of fields with
    one bound (negative values are the caller's to refuse). ``filter(None, ...)`` drops the unknowns and the zeros,
    neither of which decides a bound; a NaN that comes first makes ``max`` NaN and the comparison false, so such
    readings are taken apart by ``bound_reading``."""
    if not readings:
        return True
    if not (min(map(_GPU, readings)) >= 0 and max(map(_GPU, readings)) <= GPU_INDEX_MAX):
        return False
    return all(_largest(readings, getter) <= bound for bound, getter, _ in _GROUPS)


def _largest(readings: Sequence[GpuReading], getter: Callable[[GpuReading], tuple[Any, ...]]) -> Any:
    return max(filter(None, chain.from_iterable(map(getter, readings))), default=0)


def bound_reading(g: GpuReading, rejected: dict[str, int]) -> GpuReading | None:
    """The reading with each value that does not fit its column dropped (``None``), or ``None`` when its GPU index
    cannot be stored; each rejection counted in ``rejected`` by reason."""
    if not 0 <= g.gpu <= GPU_INDEX_MAX:
        rejected[GPU_INDEX_OUT_OF_RANGE] = rejected.get(GPU_INDEX_OUT_OF_RANGE, 0) + 1
        return None
    dropped: dict[str, None] = {}
    for bound, _, names in _GROUPS:
        for name in names:
            value = getattr(g, name)
            if value is not None and not abs(value) <= bound and not (isinstance(value, float) and math.isnan(value)):
                dropped[name] = None
    if not dropped:
        return g
    rejected[VALUE_OUT_OF_RANGE] = rejected.get(VALUE_OUT_OF_RANGE, 0) + len(dropped)
    return dataclasses.replace(g, **dropped)  # type: ignore[arg-type]


def link_storable(link: LinkReading) -> bool:
    """Whether the link's index fits ``nvlink_down.link``."""
    return 0 <= link.link <= SQL_INT_MAX[LINK_TYPE]


def process_storable(process: ProcessReading) -> bool:
    """Whether the process's pid and memory fit ``process_latest``."""
    used = process.memory_used_bytes
    return 0 <= process.pid <= SQL_INT_MAX[PID_TYPE] and (used is None or 0 <= used <= SQL_INT_MAX[BYTES_TYPE])


def all_links_storable(links: Sequence[LinkReading]) -> bool:
    """``link_storable`` of every link, in C."""
    return not links or (min(map(_LINK, links)) >= 0 and max(map(_LINK, links)) <= SQL_INT_MAX[LINK_TYPE])
