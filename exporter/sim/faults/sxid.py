"""Fault kind ``sxid``: an NVSwitch of the node reports an SXid, printed as the driver prints one event: three
kernel-log lines (``Data {...}``, ``Fatal``/``Non-fatal, Link N``, ``Severity``) that count as one. A single event
at ``at``; its signature is ``gpulens_nvswitch_sxid_errors_total`` with the catalogue's severity. The GPUs' readings
do not change."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from msgspec import Meta

from gpulens.exporter.sim.faults.kind import FaultKind, FaultParams


class SxidParams(FaultParams, frozen=True, tag="sxid"):
    """``node``, ``at``, the SXid code and the switch (0-based, default 0); no ``duration``."""

    node: str
    sxid: Annotated[int, Meta(ge=1)]
    switch: Annotated[int, Meta(ge=0, le=15)] = 0


class Sxid(FaultKind):
    name = "sxid"
    params = SxidParams
    target = "node"
    single_event = True

    def unknown_key(self, key: str) -> str:
        if key == "duration":
            return "an sxid is a single event at `at`; it takes no duration"
        return super().unknown_key(key)

    def extras(self, params: Any) -> Mapping[str, Any]:
        assert isinstance(params, SxidParams)
        return {"xid": params.sxid, "switch": params.switch}
