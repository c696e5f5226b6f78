"""Fault kind ``kernel_xid``: the driver writes an Xid line to the kernel log and NVML delivers no event (an XID
raised while the exporter was restarting, or on a GPU NVML cannot open). A single event at ``at``; the exporter
counts it from the kernel log alone."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpulens.exporter.sim.faults.xid import Xid, XidParams


class KernelXidParams(XidParams, frozen=True, tag="kernel_xid"):
    """``gpu``, ``at`` and the XID code; no ``duration``."""


class KernelXid(Xid):
    name = "kernel_xid"
    params = KernelXidParams
    nvml = False  # no NVML event: only the kernel-log line (gpulens.exporter.sim.kernlog)

    def extras(self, params: Any) -> Mapping[str, Any]:
        assert isinstance(params, KernelXidParams)
        return {"xid": params.xid}
