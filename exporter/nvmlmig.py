"""MIG devices through NVML: the instances that exist on a MIG-enabled GPU, with their identity and memory.

The layout (which slots hold a device, and each device's UUID, instance ids and profile) changes only when an
administrator reconfigures the GPU, so it is enumerated every ``SLOW_REFRESH_S``; each device's memory is read every
time. A device whose memory cannot be read (destroyed since?) makes the read enumerate the layout again at once.
"""

from __future__ import annotations

from typing import Any

from gpulens.exporter.nvmlcalls import QUIET_NOT_FOUND, Calls, as_int, as_text
from gpulens.exporter.nvmldevice import memory
from gpulens.exporter.nvmlgpu import Gpu, MigIdentity
from gpulens.model import MigReading


def read_migs(calls: Calls, gpu: Gpu, node: str, now: float) -> tuple[MigReading, ...]:
    """The MIG devices that exist now, at monotonic time ``now``, with their memory."""
    if not gpu.mig_slots:
        return ()
    if gpu.mig_layout is not None and gpu.fresh(gpu.mig_layout[0], now):
        migs, complete = _readings(calls, gpu, node, gpu.mig_layout[1])
        if complete:
            return migs
    layout = _layout(calls, gpu)  # stale, or a device's memory failed (destroyed since?): enumerate now
    gpu.mig_layout = (now, layout)
    return _readings(calls, gpu, node, layout)[0]


def _readings(
    calls: Calls, gpu: Gpu, node: str, layout: tuple[MigIdentity, ...]
) -> tuple[tuple[MigReading, ...], bool]:
    """The devices of ``layout`` with their memory now, and whether every memory read answered."""
    migs = []
    complete = True
    for mig in layout:
        used = memory(calls, gpu, mig.handle)
        complete = complete and used.total is not None
        migs.append(
            MigReading(
                node=node,
                gpu=gpu.index,
                uuid=gpu.uuid,
                mig_uuid=mig.mig_uuid,
                gpu_instance_id=mig.gpu_instance_id,
                compute_instance_id=mig.compute_instance_id,
                profile=mig.profile,
                memory_used_bytes=used.used,
                memory_total_bytes=used.total,
            )
        )
    return tuple(migs), complete


def _layout(calls: Calls, gpu: Gpu) -> tuple[MigIdentity, ...]:
    """The MIG devices that exist now (empty slots answer NotFound)."""
    found = []
    for slot in range(gpu.mig_slots):
        handle = calls.call(gpu, "nvmlDeviceGetMigDeviceHandleByIndex", gpu.handle, slot, quiet=QUIET_NOT_FOUND)
        mig = None if handle is None else _identity(calls, gpu, handle)
        if mig is not None:
            found.append(mig)
    return tuple(found)


def _identity(calls: Calls, gpu: Gpu, handle: Any) -> MigIdentity | None:
    call = calls.call
    mig_uuid = as_text(call(gpu, "nvmlDeviceGetUUID", handle))
    gpu_instance = as_int(call(gpu, "nvmlDeviceGetGpuInstanceId", handle))
    if mig_uuid is None or gpu_instance is None:
        return None
    name = as_text(call(gpu, "nvmlDeviceGetName", handle)) or ""
    return MigIdentity(
        handle=handle,
        mig_uuid=mig_uuid,
        gpu_instance_id=gpu_instance,
        compute_instance_id=as_int(call(gpu, "nvmlDeviceGetComputeInstanceId", handle)),
        profile=name.partition(" MIG ")[2] or None,  # "NVIDIA H100 80GB HBM3 MIG 1g.10gb" -> "1g.10gb"
    )
