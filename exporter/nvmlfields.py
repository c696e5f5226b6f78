"""NVML field values: the (field id, scope) pairs read in one batched ``nvmlDeviceGetFieldValues`` call per GPU.

The batch holds the memory temperature and, on NVLink GPUs, the NVLink error counters (their all-links totals, where
the driver has them) and throughput counters (all links and per link; left out where GPM measures NVLink). Each
value's type tag says which member of its union holds the number.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

import pynvml  # noqa: TID251 (the NVML modules are the pynvml choke point)

from gpulens.clock import Clock
from gpulens.exporter.nvmlcalls import LINK_END, NOT_SUPPORTED, SUCCESS, UNKNOWN, Calls, optional_constant
from gpulens.exporter.nvmlgpu import Gpu

ALL_LINKS: Final = 0xFFFFFFFF  # the scopeId that asks a per-link field for the sum over all links

FI_MEMORY_TEMP: Final[int] = pynvml.NVML_FI_DEV_MEMORY_TEMP
FI_NVLINK_TX: Final[int] = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
FI_NVLINK_RX: Final[int] = pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
FI_NVLINK_CRC: Final[int] = pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
FI_NVLINK_REPLAY: Final[int] = pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL
FI_NVLINK_RECOVERY: Final[int] = pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL
_FIELD_NAMES: Final[dict[int, str]] = {
    FI_MEMORY_TEMP: "NVML_FI_DEV_MEMORY_TEMP",
    FI_NVLINK_TX: "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
    FI_NVLINK_RX: "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
    FI_NVLINK_CRC: "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    FI_NVLINK_REPLAY: "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    FI_NVLINK_RECOVERY: "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
}


def _value_members() -> dict[int, str]:
    """Value type tag -> the member of ``c_nvmlValue_t`` that holds the number (tags the library lacks are left out)."""
    members = {
        pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    }
    unsigned_short = optional_constant("NVML_VALUE_TYPE_UNSIGNED_SHORT")  # nvidia-ml-py 12.560+
    if unsigned_short is not None:
        members[unsigned_short] = "usVal"
    return members


VALUE_MEMBERS: Final[dict[int, str]] = _value_members()

# The members of each returned value, read through ctypes' own field descriptors: pynvml's structures override
# attribute access in Python (to decode bytes, which these integer members never are), a cost paid per field.
_STRUCT: Final = pynvml.c_nvmlFieldValue_t
_RETURN: Final = _STRUCT.nvmlReturn.__get__
_TYPE: Final = _STRUCT.valueType.__get__
_VALUE: Final = _STRUCT.value.__get__


NVLINK_ERROR_TOTALS: Final = (FI_NVLINK_CRC, FI_NVLINK_REPLAY, FI_NVLINK_RECOVERY)


def field_ids(
    links: int, *, nvlink_counters: bool = True, per_link_errors: Collection[int] = ()
) -> tuple[tuple[int, int], ...]:
    """The (field id, scope id) pairs read in one nvmlDeviceGetFieldValues call per GPU and read.

    ``nvlink_counters`` is False where GPM measures NVLink throughput; ``per_link_errors`` are the error totals that
    the driver refuses (they are summed over links by ``gpulens.exporter.nvmllinks`` instead).
    """
    ids = [(FI_MEMORY_TEMP, 0)]
    if links:
        ids += [(field_id, 0) for field_id in NVLINK_ERROR_TOTALS if field_id not in per_link_errors]
        if nvlink_counters:
            ids += [(FI_NVLINK_TX, ALL_LINKS), (FI_NVLINK_RX, ALL_LINKS)]
            for link in range(links):
                ids += [(FI_NVLINK_TX, link), (FI_NVLINK_RX, link)]
    return tuple(ids)


FieldValues = dict[tuple[int, int], float | None]


def read_field_values(calls: Calls, gpu: Gpu, clock: Clock) -> tuple[FieldValues, float]:
    """The GPU's batched field values by (field id, scope id), and the monotonic time they were read."""
    values = calls.call(gpu, "nvmlDeviceGetFieldValues", gpu.handle, list(gpu.fields))
    now = clock.monotonic()
    if values is None:
        return {}, now
    found: FieldValues = {}
    members = VALUE_MEMBERS
    for key, value in zip(gpu.fields, values, strict=True):
        code = _RETURN(value, _STRUCT)
        member = members.get(_TYPE(value, _STRUCT)) if code == SUCCESS else None
        if member is None:
            _field_failed(calls, gpu, key, int(code))
            found[key] = None
        else:
            number = getattr(_VALUE(value, _STRUCT), member)
            found[key] = float(number) if member == "dVal" else int(number)
    return found, now


def _field_failed(calls: Calls, gpu: Gpu, key: tuple[int, int], code: int) -> None:
    """Give a field that did not answer (or answered with a type tag this library lacks) its meaning."""
    field_id, scope = key
    what = _FIELD_NAMES.get(field_id, f"field {field_id}") + ("" if scope in (0, ALL_LINKS) else f"[{scope}]")
    # Drivers that cannot sum over all links refuse that scope; the per-link counters stand in for it.
    quiet = LINK_END if scope == ALL_LINKS else frozenset()
    calls.failed(gpu, what, UNKNOWN if code == SUCCESS else code, quiet=quiet)
    if code == NOT_SUPPORTED and field_id in NVLINK_ERROR_TOTALS:
        gpu.nvlink_errors_per_link.add(field_id)  # from the next read, summed over the links instead
