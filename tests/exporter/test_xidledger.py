"""The XID ledger: each XID event once whichever channels report it (NVML, the kernel log's Xid line, the
fallen-off-the-bus message), node XIDs for unknown addresses, SXids once per event, escalation across restarts, and
bounded state whatever the log holds."""

from __future__ import annotations

import json
from pathlib import Path

from gpulens.clock import ManualClock
from gpulens.exporter.xidledger import (
    DEDUPE_WINDOW_S,
    MAX_COUNTS,
    MAX_KEYS,
    OCCURRENCES_FILE,
    XidLedger,
)
from gpulens.kernelmodel import XidAction
from gpulens.kernlog import SXID, XID, KernelLogParser, KernelRecord
from gpulens.model import NodeSnapshot
from tests.fakes.static_source import h100, node_snapshot

BUS = "0000:3b:00"
NVML_BUS = "00000000:3B:00.0"


def snapshot(xids: dict[int, int] | None = None, *, up: bool = True) -> NodeSnapshot:
    base = node_snapshot(gpus=2)
    g0 = h100("node-00", 0, base.timestamp, pci_bus_id=NVML_BUS, xid_errors=xids or {}, up=up)
    g1 = h100("node-00", 1, base.timestamp, pci_bus_id="00000000:3C:00.0")
    return base.replace(gpus=(g0, g1))


def ledger(tmp_path: Path | None = None) -> tuple[XidLedger, ManualClock]:
    clock = ManualClock()
    return XidLedger(str(tmp_path) if tmp_path else None, clock=clock.monotonic), clock


def xid_line(code: int, bus: str = BUS) -> KernelRecord:
    return KernelRecord(XID, bus, code)


def test_an_event_seen_by_nvml_and_in_the_kernel_log_counts_once_in_either_order() -> None:
    first, _ = ledger()
    first.record(xid_line(48))
    assert first.enrich(snapshot({48: 1})).gpus[0].xid_errors == {48: 1}
    second, clock = ledger()
    assert second.enrich(snapshot({48: 1})).gpus[0].xid_errors == {48: 1}
    clock.advance(2)
    second.record(xid_line(48))
    assert second.enrich(snapshot({48: 1})).gpus[0].xid_errors == {48: 1}


def test_two_faults_count_twice_and_a_late_report_is_a_new_event() -> None:
    led, clock = ledger()
    led.record(xid_line(13))
    led.record(xid_line(13))  # two faults in one second: both lines count
    assert led.enrich(snapshot({13: 2})).gpus[0].xid_errors == {13: 2}  # and NVML's two events pair with them
    clock.advance(DEDUPE_WINDOW_S + 1)
    led.record(xid_line(13))
    assert led.enrich(snapshot({13: 2})).gpus[0].xid_errors == {13: 3}


def test_xid_79_then_fallen_off_the_bus_counts_once_and_reaches_a_lost_gpu() -> None:
    led, _ = ledger()
    led.record(xid_line(79))
    led.record(KernelRecord(XID, BUS, 79, fallen=True))
    out = led.enrich(snapshot(up=False))  # NVML lost the GPU and never delivered the event
    assert out.gpus[0].xid_errors == {79: 1}
    assert out.gpus[0].up is False


def test_an_unknown_address_is_a_node_xid_and_sxids_count_once_per_event() -> None:
    led, _ = ledger()
    parser = KernelLogParser()
    lines = [
        "NVRM: Xid (PCI:0019:02:00): 149, x",
        "nvidia-nvswitch1: SXid (PCI:0000:07:00.0): 22013, Data {0x1}",
        "nvidia-nvswitch1: SXid (PCI:0000:07:00.0): 22013, Non-fatal, Link 12 x",
        "nvidia-nvswitch1: SXid (PCI:0000:07:00.0): 22013, Severity 1 Engine instance 12",
        "nvidia-nvswitch4: SXid (PCI:0000:86:00.0): 24007, Fatal, Link 3 x",
    ]
    for line in lines:
        for record in parser.feed(line):
            led.record(record)
    view = led.enrich(snapshot()).kernel
    assert view is not None
    assert view.node_xids == (("0019:02:00", 149, 1),)
    assert view.sxids == (("0000:07:00.0", 22013, 1), ("0000:86:00.0", 24007, 1))
    assert all(r.kind in (XID, SXID) for r in parser.flush())


def test_escalation_survives_restarts(tmp_path: Path) -> None:
    uuid = snapshot().gpus[0].uuid
    for restart in range(3):  # three exporter lives (or reboots), one XID 79 each
        led, _ = ledger(tmp_path)
        led.record(xid_line(79))
        view = led.enrich(snapshot()).kernel
        assert view is not None
        action = "reboot" if restart < 2 else "hardware-inspection"
        assert view.actions == (XidAction(uuid, 79, action, restart + 1),)
    saved = json.loads((tmp_path / OCCURRENCES_FILE).read_text())
    assert saved == {uuid: {"79": 3}}


def test_an_application_xid_never_escalates_and_a_bad_state_dir_is_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    led, clock = ledger(blocker / "sub")  # cannot be created: logged once, kept in memory
    for _ in range(10):
        led.record(xid_line(13))
        clock.advance(DEDUPE_WINDOW_S + 1)
    view = led.enrich(snapshot()).kernel
    assert view is not None
    assert view.actions[0].action == "check-application"
    assert view.actions[0].occurrences == 10


def test_state_is_bounded_whatever_the_log_holds() -> None:
    led, _ = ledger()
    for i in range(200_000):  # a flood of distinct addresses and codes
        led.report(f"{i >> 16:04x}:{(i >> 8) & 0xFF:02x}:{i & 0xFF:02x}", i % 7, "kernel")
    assert len(led._pending) <= MAX_KEYS
    assert len(led._counts) <= MAX_COUNTS
    led.report(BUS, 79, "kernel", count=10**9)  # an absurd NVML jump is bounded too
    assert max(len(events) for events in led._pending.values()) <= 64
