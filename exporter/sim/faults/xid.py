"""Fault kind ``xid``: a GPU reports one XID error (a single event at ``at``, counted from then on): NVML delivers
the event and the driver writes its kernel-log line (``gpulens.exporter.sim.kernlog``), so that an XID on a GPU lost
in the same moment (XID 79 with ``gpu_lost``) is still counted, from the kernel log."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from msgspec import Meta

from gpulens.exporter.sim.faults.kind import FaultKind, FaultParams
from gpulens.exporter.sim.specs import FaultSpec
from gpulens.exporter.sim.stepstate import Counters


class XidParams(FaultParams, frozen=True, tag="xid"):
    """``gpu``, ``at`` and the XID code; no ``duration``."""

    gpu: str
    xid: Annotated[int, Meta(ge=1)]


class Xid(FaultKind):
    name = "xid"
    params = XidParams
    target = "gpu"
    single_event = True
    nvml = True  # NVML delivers the event (``kernel_xid``: the kernel-log line only)

    def unknown_key(self, key: str) -> str:
        if key == "duration":
            return "an xid is a single event at `at`; it takes no duration"
        return super().unknown_key(key)

    def extras(self, params: Any) -> Mapping[str, Any]:
        assert isinstance(params, XidParams)
        return {"xid": params.xid}

    def count(self, fault: FaultSpec, elapsed_s: float, counters: Counters) -> None:
        if self.nvml and fault.xid is not None:
            counters.xids[fault.xid] = counters.xids.get(fault.xid, 0) + 1
