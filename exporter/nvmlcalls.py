"""The NVML choke point: every call into ``pynvml`` goes through ``Calls``, which turns NVML's errors into meanings.

Also here: NVML start-up with an error that says what to do (``start_nvml``), the NVML return codes gpulens acts on,
and the small converters from NVML's values. Only the ``exporter/nvml*.py`` modules import ``pynvml``; constants that
a supported ``nvidia-ml-py`` release may lack are read with ``optional_constant`` (see docs/domain.md on NVML errors).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, Final, Protocol

import pynvml  # noqa: TID251 (the NVML modules are the pynvml choke point)

from gpulens.exporter.nvmldeadline import CallDeadline
from gpulens.logutil import ErrorCounter, LogOnce
from gpulens.model import SourceError

log = logging.getLogger(__name__)

SUCCESS: Final[int] = pynvml.NVML_SUCCESS
INVALID_ARGUMENT: Final[int] = pynvml.NVML_ERROR_INVALID_ARGUMENT
NOT_SUPPORTED: Final[int] = pynvml.NVML_ERROR_NOT_SUPPORTED
NO_PERMISSION: Final[int] = pynvml.NVML_ERROR_NO_PERMISSION
NOT_FOUND: Final[int] = pynvml.NVML_ERROR_NOT_FOUND
TIMEOUT: Final[int] = pynvml.NVML_ERROR_TIMEOUT
FUNCTION_NOT_FOUND: Final[int] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
GPU_IS_LOST: Final[int] = pynvml.NVML_ERROR_GPU_IS_LOST
UNKNOWN: Final[int] = pynvml.NVML_ERROR_UNKNOWN

LINK_END: Final = frozenset({NOT_SUPPORTED, INVALID_ARGUMENT})
QUIET_TIMEOUT: Final = frozenset({TIMEOUT})
QUIET_NOT_FOUND: Final = frozenset({NOT_FOUND})

# pynvml raises this (not an NVMLError) when an unversioned call's newest C symbol is missing from an older driver;
# releases of nvidia-ml-py before it existed raise NVMLError_FunctionNotFound there instead.
_LIBRARY_MISMATCH: Final[type[Exception]] = getattr(
    pynvml, "NVMLLibraryMismatchError", pynvml.NVMLError_FunctionNotFound
)

_NO_NVML_HINT: Final = "On a machine without GPUs use --source sim; with a dcgm-exporter use --source dcgm"
_INIT_PROBLEMS: Final[dict[int, str]] = {
    pynvml.NVML_ERROR_LIBRARY_NOT_FOUND: "NVML library not found (libnvidia-ml.so.1): is the NVIDIA driver installed?",
    pynvml.NVML_ERROR_DRIVER_NOT_LOADED: "NVIDIA driver not loaded: is the nvidia kernel module loaded (see dmesg)?",
    pynvml.NVML_ERROR_NO_PERMISSION: "no permission to open the GPUs: can this user read and write /dev/nvidia*?",
    pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH: "NVML and the kernel driver differ in version: reboot or reload it.",
}


def optional_constant(name: str) -> int | None:
    """A ``pynvml`` constant that older ``nvidia-ml-py`` releases lack, or None there.

    ``NVML_VALUE_TYPE_UNSIGNED_SHORT`` exists from 12.560; pyproject allows 12.535.
    """
    value = getattr(pynvml, name, None)
    return value if isinstance(value, int) else None


class GpuLostError(Exception):
    """Raised by the choke point when NVML says a GPU is gone; it ends that GPU's read."""


class LosableGpu(Protocol):
    """What the choke point needs of a GPU: its index (for messages) and whether it is lost (it sets that)."""

    index: int
    lost: bool


def error_code(exc: BaseException) -> int:
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else UNKNOWN


def describe(code: int) -> str:
    return str(pynvml.NVMLError(code))


def as_int(value: Any) -> int | None:
    return None if value is None else int(value)


def scaled(value: Any, factor: float) -> float | None:
    return None if value is None else float(value) * factor


def as_text(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    return value if isinstance(value, str) and value else None


class Calls:
    """The one choke point between gpulens and NVML: calls a function and turns its errors into meanings.

    NotSupported: the value is absent. FunctionNotFound (an older driver): absent, logged once and never called
    again, so that an older call can stand in. NoPermission: absent, logged once per function. GpuIsLost, and
    Unknown from a GPU already lost: the GPU is lost (``GpuLostError`` ends its read). Anything else: absent, counted.
    Every call runs under ``deadline`` (``nvmldeadline``): while NVML is hung a call raises ``NvmlHungError``.
    """

    def __init__(self, nvml: Any, errors: ErrorCounter, deadline: CallDeadline | None = None) -> None:
        self._nvml = nvml
        self._errors = errors
        self.deadline = deadline or CallDeadline()
        self._once = LogOnce(log)
        self._missing: set[str] = set()
        self._lock = threading.Lock()

    def attempt(
        self,
        gpu: LosableGpu | None,
        name: str,
        *args: Any,
        key: str | None = None,
        quiet: frozenset[int] = frozenset(),
        unsupported: str = "nvml_not_supported",
        **kwargs: Any,
    ) -> tuple[Any, int | None]:
        """Call ``nvml.<name>(*args, **kwargs)``: (result, None) on success, (None, NVML error code) on failure.

        ``key`` names the call where one Python function wraps several C functions (``nvmlDeviceGetMemoryInfo``
        with ``version=``); ``quiet`` lists codes that are an expected answer, neither counted nor logged;
        ``unsupported`` is the reason NotSupported is counted under. Raises ``NvmlHungError`` while NVML is hung.
        """
        what = key or name
        if what in self._missing:  # read without the lock: a set's membership test is atomic, and this runs per call
            return None, FUNCTION_NOT_FOUND
        function = getattr(self._nvml, name, None)
        if function is None:
            self._function_missing(what)
            return None, FUNCTION_NOT_FOUND
        token = self.deadline.begin(what)
        try:
            return function(*args, **kwargs), None
        except _LIBRARY_MISMATCH:
            self._function_missing(what)
            return None, FUNCTION_NOT_FOUND
        except pynvml.NVMLError as exc:
            code = error_code(exc)
            self.failed(gpu, what, code, quiet=quiet, unsupported=unsupported)
            return None, code
        finally:
            self.deadline.end(token)

    def call(self, gpu: LosableGpu | None, name: str, *args: Any, **kwargs: Any) -> Any:
        """The result of an NVML call, or None when it failed."""
        return self.attempt(gpu, name, *args, **kwargs)[0]

    def first(self, gpu: LosableGpu | None, names: Sequence[str], *args: Any) -> Any:
        """The result of the first of ``names`` (newest first) that the driver has, or None."""
        for name in names:
            value, code = self.attempt(gpu, name, *args)
            if code != FUNCTION_NOT_FOUND:
                return value
        return None

    def is_missing(self, name: str) -> bool:
        with self._lock:
            return name in self._missing

    def failed(
        self,
        gpu: LosableGpu | None,
        what: str,
        code: int,
        *,
        quiet: frozenset[int] = frozenset(),
        unsupported: str = "nvml_not_supported",
    ) -> None:
        """Give a failed call (or field value) its meaning. Raises ``GpuLostError`` when ``gpu`` is gone."""
        where = "the node" if gpu is None else f"GPU {gpu.index}"
        if code in quiet:
            return
        if code == NOT_SUPPORTED:
            self._errors.count(unsupported, "NVML: %s is not supported on %s; omitted", what, where, level=logging.INFO)
        elif code == FUNCTION_NOT_FOUND:
            self._function_missing(what)
        elif code == NO_PERMISSION:
            self._errors.count("nvml_no_permission")
            self._once(f"permission:{what}", "NVML: no permission for %s on %s; omitted", what, where)
        elif code == GPU_IS_LOST or (code == UNKNOWN and gpu is not None and gpu.lost):
            if gpu is None:
                self._errors.count("nvml_gpu_lost", "NVML: %s failed: a GPU is lost", what)
                return
            gpu.lost = True
            raise GpuLostError(gpu.index)
        else:
            self._errors.count("nvml_error")
            self._once(f"error:{what}:{code}", "NVML: %s failed on %s: %s", what, where, describe(code))

    def _function_missing(self, name: str) -> None:
        with self._lock:
            self._missing.add(name)
        self._errors.count("nvml_function_not_found")
        self._once(f"missing:{name}", "NVML function %s is not available (older driver?); not called again", name)


def start_nvml(nvml: Any) -> None:
    """``nvmlInit``, with a start-up error that says what is wrong and what to do instead."""
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as exc:
        problem = _INIT_PROBLEMS.get(error_code(exc), f"NVML could not start: {exc}.")
        raise SourceError(f"{problem} {_NO_NVML_HINT}") from exc
