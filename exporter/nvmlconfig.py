"""Each GPU's settings that the cluster's nodes should agree on, and its NVLink fabric state, through NVML.

``GpuConfigs.read`` gives one ``GpuConfig`` per GPU (``gpulens.nodehardware``), read again every ``SLOW_REFRESH_S``:

- persistence mode (``nvmlDeviceGetPersistenceMode``) and the current ECC mode (``nvmlDeviceGetEccMode``);
- the GPU's registration with the NVLink fabric (``nvmlDeviceGetGpuFabricInfoV``, else the older
  ``nvmlDeviceGetGpuFabricInfo``): on NVSwitch systems (HGX, GB200 NVL) the fabric manager registers each GPU, and
  until its state is ``completed`` with a success status CUDA cannot start there. A driver or GPU without a fabric
  answers NotSupported or the state ``NOT_SUPPORTED``: the state is then unknown (``None``), never "not ready".

Every call goes through ``Calls``; a GPU lost meanwhile keeps its last settings.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Final

import pynvml  # noqa: TID251 (the NVML modules are the pynvml choke point)

from gpulens.exporter.nvmlcalls import FUNCTION_NOT_FOUND, Calls, GpuLostError, as_int
from gpulens.exporter.nvmlgpu import SLOW_REFRESH_S, Gpu
from gpulens.nodehardware import FABRIC_COMPLETED, FABRIC_IN_PROGRESS, FABRIC_NOT_STARTED, GpuConfig

_FABRIC_STATES: Final = {
    pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: FABRIC_NOT_STARTED,
    pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: FABRIC_IN_PROGRESS,
    pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: FABRIC_COMPLETED,
}
_QUIET: Final = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED})  # no fabric, no ECC: an answer, not a failure


def _enabled(value: object) -> bool | None:
    code = as_int(value)
    return None if code is None else code == pynvml.NVML_FEATURE_ENABLED


def fabric_state(calls: Calls, gpu: Gpu) -> tuple[str | None, bool | None]:
    """(state name, ready) of the GPU's fabric registration; (None, None) where the driver offers none."""
    versioned = getattr(pynvml, "c_nvmlGpuFabricInfoV_t", None)  # nvidia-ml-py 12.550 and later
    code: int | None = FUNCTION_NOT_FOUND
    if versioned is not None:
        info: ctypes.Structure = versioned()
        _, code = calls.attempt(gpu, "nvmlDeviceGetGpuFabricInfoV", gpu.handle, ctypes.byref(info), quiet=_QUIET)
    if code == FUNCTION_NOT_FOUND:  # a driver (or nvidia-ml-py) before 550
        info = pynvml.c_nvmlGpuFabricInfo_t()
        _, code = calls.attempt(gpu, "nvmlDeviceGetGpuFabricInfo", gpu.handle, ctypes.byref(info), quiet=_QUIET)
    if code is not None:
        return None, None
    state = _FABRIC_STATES.get(int(info.state))
    if state is None:  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
        return None, None
    return state, state == FABRIC_COMPLETED and int(info.status) == pynvml.NVML_SUCCESS


def read_config(calls: Calls, gpu: Gpu) -> GpuConfig:
    """One GPU's settings now; raises ``GpuLostError`` if it is lost."""
    persistence = _enabled(calls.call(gpu, "nvmlDeviceGetPersistenceMode", gpu.handle))
    ecc = calls.call(gpu, "nvmlDeviceGetEccMode", gpu.handle, quiet=_QUIET)
    state, ready = fabric_state(calls, gpu)
    return GpuConfig(
        gpu=gpu.index,
        uuid=gpu.uuid,
        persistence_mode=persistence,
        ecc_enabled=_enabled(ecc[0]) if ecc else None,
        fabric_state=state,
        fabric_ready=ready,
    )


class GpuConfigs:
    """The settings of every GPU, read every ``refresh_s``; a lost GPU keeps the settings read before."""

    def __init__(self, calls: Calls, refresh_s: float = SLOW_REFRESH_S) -> None:
        self._calls = calls
        self._refresh_s = refresh_s
        self._read_at: float | None = None
        self._configs: dict[int, GpuConfig] = {}

    def read(self, gpus: Sequence[Gpu], now: float) -> tuple[GpuConfig, ...]:
        if self._read_at is None or now - self._read_at >= self._refresh_s:
            self._read_at = now
            for gpu in gpus:
                if gpu.lost:
                    continue
                try:
                    self._configs[gpu.index] = read_config(self._calls, gpu)
                except GpuLostError:
                    continue
        return tuple(self._configs[g.index] for g in gpus if g.index in self._configs)
