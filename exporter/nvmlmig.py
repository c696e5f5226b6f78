"""MIG devices through NVML: the instances that exist now on a MIG-enabled GPU, with their identity and memory."""

from __future__ import annotations

from typing import Any

from exporter.nvmlcalls import QUIET_NOT_FOUND, Calls, as_int, as_text
from exporter.nvmldevice import memory
from exporter.nvmlgpu import Gpu
from gpulens.model import MigReading


def read_migs(calls: Calls, gpu: Gpu, node: str) -> tuple[MigReading, ...]:
    """The MIG devices that exist now (empty slots answer NotFound)."""
    migs = []
    for slot in range(gpu.mig_slots):
        handle = calls.call(gpu, "nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, slot, quiet=QUIET_NOT_FOUND)
        mig = None if handle is None else _mig(calls, gpu, node, handle)
        if mig is not None:
            migs.append(mig)
    return tuple(migs)


def _mig(calls: Calls, gpu: Gpu, node: str, handle: Any) -> MigReading | None:
    call = calls.call
    mig_uuid = as_text(call(gpu, "nvmlDeviceGetUUID", handle))
    gpu_instance = as_int(call(gpu, "nvmlDeviceGetGpuInstanceId", handle))
    if mig_uuid is None or gpu_instance is None:
        return None
    name = as_text(call(gpu, "nvmlDeviceGetName", handle)) or ""
    used = memory(calls, gpu, handle)
    return MigReading(
        node=node,
        gpu=gpu.index,
        uuid=gpu.uuid,
        mig_uuid=mig_uuid,
        gpu_instance_id=gpu_instance,
        compute_instance_id=as_int(call(gpu, "nvmlDeviceGetComputeInstanceId", handle)),
        profile=name.partition(" MIG ")[2] or None,  # "NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> "1g.10gb"
        memory_used_bytes=used.used,
        memory_total_bytes=used.total,
    )
