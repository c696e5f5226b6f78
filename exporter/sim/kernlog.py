"""The simulated kernel log: the lines the NVIDIA driver writes for each ``xid``, ``kernel_xid`` and ``sxid`` fault
of a node, and what the exporter's kernel-log reader makes of them.

Each fault writes what a real driver writes, in plain ``dmesg`` form (uptime from the scenario's start): an Xid
line on the GPU's PCI address (``NVRM: Xid (PCI:0000:18:00): 79, pid=..., ...``), or an SXid event as three lines
sharing its switch address and code. The lines are read back with the exporter's own parser
(``gpulens.kernlog``), so a simulated node reports exactly what the parser understands. What a node's readings
carry is what an exporter reading both NVML and the kernel log reports: each GPU's XID counts are the larger of
NVML's and the kernel log's per code (every ``xid`` fault is both an NVML event and a line, so the two pair up;
``kernel_xid`` is a line alone), also on a GPU that is lost; SXids and each GPU's XID actions are the node's
``KernelView``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Final

from gpulens.exporter.sim.specs import FaultSpec
from gpulens.kernelmodel import KernelView, XidAction
from gpulens.kernlog import SXID, KernelLogParser, KernelRecord, pci_key
from gpulens.model import GpuReading
from gpulens.xidcatalogue import SXID_BY_CODE, XID_BY_CODE, sxid_severity, xid_action

BOOT_UPTIME_S: Final = 600.0  # the node booted ten minutes before the scenario starts
XID_KINDS: Final = ("xid", "kernel_xid")


def switch_address(switch: int) -> str:
    """The PCI address of NVSwitch ``switch`` on a simulated HGX board."""
    return f"0000:{0x05 + switch:02x}:00.0"


def driver_lines(fault: FaultSpec, gpu_bus_id: str | None, uptime_s: float) -> list[str]:
    """What the driver prints for ``fault`` (an ``xid``/``kernel_xid`` on a GPU at ``gpu_bus_id``, or an ``sxid``)."""
    stamp = f"[{uptime_s:12.6f}]"
    code = fault.xid or 0
    if fault.kind == "sxid":
        switch = fault.switch or 0
        head = f"{stamp} nvidia-nvswitch{switch}: SXid (PCI:{switch_address(switch)}): {code},"
        entry = SXID_BY_CODE.get(code)
        fatality = "Fatal" if sxid_severity(code) == "fatal" else "Non-fatal"
        what = entry.name if entry else "error"
        return [
            f"{head} Data {{0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000}}",
            f"{head} {fatality}, Link 00 {what}",
            f"{head} Severity {1 if fatality == 'Fatal' else 0} Engine instance 00 Sub-engine instance 00",
        ]
    address = pci_key(gpu_bus_id or "") or "0000:00:00"
    known = XID_BY_CODE.get(code)
    text = known.name if known else "error"
    return [f"{stamp} NVRM: Xid (PCI:{address}): {code}, pid='<unknown>', name=<unknown>, {text}."]


class NodeKernelLog:
    """One node's kernel log: its faults' lines in time order, parsed once; ``at(t)`` says what was written by
    ``t``."""

    def __init__(self, faults: Iterable[FaultSpec], bus_ids: Mapping[int, str], scenario_start: float) -> None:
        self.lines: list[tuple[float, str]] = []
        for fault in sorted(faults, key=lambda f: (f.start, f.index)):
            bus = bus_ids.get(fault.gpu.index) if fault.gpu is not None else None
            uptime = BOOT_UPTIME_S + fault.start - scenario_start
            self.lines += [(fault.start, line) for line in driver_lines(fault, bus, uptime)]
        parser = KernelLogParser()
        self._records: list[tuple[float, KernelRecord]] = []
        for at, line in self.lines:
            self._records += [(at, r) for r in parser.feed(line, at)]
        self._records += [(r.tag if isinstance(r.tag, float) else 0.0, r) for r in parser.flush()]

    def counts(self, t: float) -> tuple[dict[str, dict[int, int]], dict[tuple[str, int], int]]:
        """Xid counts per GPU address and code, and SXid events per switch address and code, written by ``t``."""
        xids: dict[str, dict[int, int]] = {}
        sxids: dict[tuple[str, int], int] = {}
        for at, r in self._records:
            if at > t:
                break
            if r.kind == SXID:
                if not r.continuation:
                    sxids[(r.pci_bus_id, r.code)] = sxids.get((r.pci_bus_id, r.code), 0) + 1
            else:
                per = xids.setdefault(r.pci_bus_id, {})
                per[r.code] = per.get(r.code, 0) + 1
        return xids, sxids

    def merge(self, readings: list[GpuReading], t: float) -> tuple[list[GpuReading], KernelView | None]:
        """The readings with the kernel log's XIDs merged in, and the node's view; unchanged when the log holds
        nothing by ``t``."""
        if not self._records or self._records[0][0] > t:
            return readings, None
        xids, sxids = self.counts(t)
        out = []
        actions = []
        for g in readings:
            logged = xids.get(pci_key(g.pci_bus_id or "") or "", {})
            merged = dict(g.xid_errors)
            for code, count in logged.items():
                merged[code] = max(merged.get(code, 0), count)
            out.append(g if merged == g.xid_errors else dataclasses.replace(g, xid_errors=merged))
            actions += [XidAction(g.uuid, code, xid_action(code, n), n) for code, n in sorted(merged.items())]
        view = KernelView(sxids=tuple(sorted((a, c, n) for (a, c), n in sxids.items())), actions=tuple(actions))
        return out, view
