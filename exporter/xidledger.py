"""The XID ledger: one count per XID event whichever way it is reported, and each GPU's action for it.

An XID reaches the exporter by up to three channels: the source (NVML's event, a dcgm-exporter counter), the
driver's ``NVRM: Xid`` kernel-log line, and, for XID 79, the number-less "fallen off the bus" message. Each
report is keyed by the GPU's PCI address (``gpulens.kernlog.pci_key``) and code. **Dedupe**: a report joins the
oldest event of the same key, within ``DEDUPE_WINDOW_S``, that no report of its own channel has joined yet;
otherwise it is a new event. So the NVML event and the kernel line of one fault count once in either order, an
Xid 79 line followed by the fallen-off message counts once, and two Xid 13 lines in one second (two faults, each
also an NVML event) count twice. The source's counts are cumulative: each collection's growth per code is that
many reports, at the collection's time.

Each GPU's ``xid_errors`` becomes the number of events of its address and code (never below the source's own
count: every source report is in a distinct event). An address no GPU of the snapshot has is a node XID
(``KernelView.node_xids``); SXids are counted per switch address and code, once per event (the parser marks an
event's later lines).

**Escalation**: each event on a GPU adds one occurrence of its code, kept per GPU UUID (the PCI address for an
unknown GPU) in ``<state_dir>/xid-occurrences.json`` so that it outlives restarts and reboots; the action is
``gpulens.xidcatalogue.xid_action``. A state directory that cannot be written is logged once and occurrences are
then kept in memory only.

**Bounds**: at most ``MAX_KEYS`` dedupe keys (the oldest dropped), ``MAX_PENDING`` events per key within the
window, ``MAX_COUNTS`` counted keys and ``MAX_OCCURRENCE_KEYS`` persisted GPUs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from pathlib import Path
from typing import Final

from gpulens.kernelmodel import KernelView, XidAction
from gpulens.kernlog import SXID, KernelRecord, pci_key
from gpulens.logutil import LogOnce
from gpulens.model import GpuReading, NodeSnapshot
from gpulens.nodehardware import with_sxids
from gpulens.xidcatalogue import xid_action

log = logging.getLogger(__name__)

DEDUPE_WINDOW_S: Final = 30.0
MAX_KEYS: Final = 4096
MAX_PENDING: Final = 64
MAX_COUNTS: Final = 8192
MAX_OCCURRENCE_KEYS: Final = 1024
SOURCE: Final = "source"  # NVML's events, a dcgm-exporter's counters
KERNEL: Final = "kernel"  # an NVRM Xid line
FALLEN: Final = "fallen"  # the number-less fallen-off-the-bus message
OCCURRENCES_FILE: Final = "xid-occurrences.json"


class _Event:
    __slots__ = ("at", "channels")

    def __init__(self, at: float, channel: str) -> None:
        self.at = at
        self.channels = {channel}


class XidLedger:
    """Counts XID events per address and code from every channel, once each. Thread-safe: the kernel-log thread
    reports lines, the collection thread reports the source's counts and reads the result."""

    def __init__(self, state_dir: str | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: OrderedDict[tuple[str, int], deque[_Event]] = OrderedDict()
        self._counts: dict[tuple[str, int], int] = {}
        self._sxids: dict[tuple[str, int], int] = {}
        self._source_seen: dict[tuple[str, int], int] = {}  # (uuid, code) -> the source's count last collection
        self._occurrences: dict[str, dict[int, int]] = {}
        self._owner: dict[str, str] = {}  # address -> the GPU UUID holding it (for occurrences)
        self._dirty = False
        self._once = LogOnce(log)
        self.state_dir = Path(state_dir) if state_dir else None
        self._path = self.state_dir / OCCURRENCES_FILE if self.state_dir else None
        self._load()

    # -- reports ----------------------------------------------------------------------------------------------

    def record(self, record: KernelRecord, *, replayed: bool = False) -> None:
        """One record of the kernel-log parser. ``replayed``: a line an earlier run of the exporter already read (a
        ``--kernel-log`` file read again from its start): counted, but not a new occurrence."""
        if record.kind == SXID:
            if not record.continuation:
                key = (record.pci_bus_id, record.code)
                with self._lock:
                    if key in self._sxids or len(self._sxids) < MAX_COUNTS:
                        self._sxids[key] = self._sxids.get(key, 0) + 1
            return
        self.report(record.pci_bus_id, record.code, FALLEN if record.fallen else KERNEL, replayed=replayed)

    def report(self, address: str, code: int, channel: str, count: int = 1, *, replayed: bool = False) -> None:
        """``count`` reports of XID ``code`` on ``address`` (``dddd:bb:dd``) through ``channel``."""
        now = self._clock()
        with self._lock:
            for _ in range(min(count, MAX_PENDING)):
                self._report(address, code, channel, now, replayed)

    def _report(self, address: str, code: int, channel: str, now: float, replayed: bool) -> None:
        key = (address, code)
        events = self._pending.get(key)
        if events is None:
            events = self._pending[key] = deque(maxlen=MAX_PENDING)
            while len(self._pending) > MAX_KEYS:
                self._pending.popitem(last=False)
        else:
            self._pending.move_to_end(key)
        while events and now - events[0].at > DEDUPE_WINDOW_S:
            events.popleft()
        for event in events:
            if channel not in event.channels:
                event.channels.add(channel)
                return
        events.append(_Event(now, channel))
        if key in self._counts or len(self._counts) < MAX_COUNTS:
            self._counts[key] = self._counts.get(key, 0) + 1
        owner = self._owner.get(address, f"pci:{address}")
        if replayed:
            return
        if owner in self._occurrences or len(self._occurrences) < MAX_OCCURRENCE_KEYS:
            per = self._occurrences.setdefault(owner, {})
            per[code] = per.get(code, 0) + 1
            self._dirty = True

    # -- the collection ---------------------------------------------------------------------------------------

    def enrich(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        """The snapshot with each GPU's XID counts merged with the kernel log's, and the ledger's ``kernel`` view."""
        addresses: dict[str, GpuReading] = {}
        for g in snapshot.gpus:
            address = pci_key(g.pci_bus_id) if g.pci_bus_id else None
            if address is not None:
                addresses[address] = g
                self._claim(address, g.uuid)
        for address, g in addresses.items():  # the source's growth since the last collection: new reports
            for code, count in g.xid_errors.items():
                seen = self._source_seen.get((g.uuid, code), 0)
                if count > seen:
                    self.report(address, code, SOURCE, count - seen)
                if count != seen and len(self._source_seen) < MAX_COUNTS:
                    self._source_seen[(g.uuid, code)] = count
        with self._lock:
            counts = dict(self._counts)
            sxids = sorted((a, c, n) for (a, c), n in self._sxids.items())
            occurrences = {k: dict(v) for k, v in self._occurrences.items()}
            dirty, self._dirty = self._dirty, False
        if dirty:
            self._save(occurrences)
        per_address: dict[str, dict[int, int]] = {}
        for (address, code), count in counts.items():
            per_address.setdefault(address, {})[code] = count
        gpus = []
        actions = []
        for g in snapshot.gpus:
            address = pci_key(g.pci_bus_id) if g.pci_bus_id else None
            merged = dict(g.xid_errors)
            for code, count in (per_address.pop(address, {}) if address is not None else {}).items():
                merged[code] = max(merged.get(code, 0), count)
            gpus.append(g if merged == g.xid_errors else _with_xids(g, merged))
            known = occurrences.get(g.uuid, {})
            for code in sorted(merged):
                times = known.get(code, 0)
                actions.append(XidAction(g.uuid, code, xid_action(code, times), times))
        node_xids = sorted((a, c, n) for a, per in per_address.items() for c, n in per.items())
        view = KernelView(node_xids=tuple(node_xids), sxids=tuple(sxids), actions=tuple(actions))
        hardware = with_sxids(snapshot.hardware, view.sxids)
        return snapshot.replace(gpus=tuple(gpus), kernel=view, hardware=hardware)

    def _claim(self, address: str, uuid: str) -> None:
        """Occurrences counted under the address before its GPU was known move to the GPU's UUID."""
        with self._lock:
            if self._owner.get(address) == uuid:
                return
            self._owner[address] = uuid
            early = self._occurrences.pop(f"pci:{address}", None)
            if early:
                per = self._occurrences.setdefault(uuid, {})
                for code, n in early.items():
                    per[code] = per.get(code, 0) + n
                self._dirty = True

    # -- state --------------------------------------------------------------------------------------------------

    def _load(self) -> None:
        if self._path is None or not self._path.exists():
            return
        try:
            doc = json.loads(self._path.read_text())
            loaded = {str(k): {int(c): int(n) for c, n in v.items()} for k, v in dict(doc).items()}
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("%s is unreadable (%s); XID occurrences start from zero", self._path, exc)
            return
        self._occurrences = dict(list(loaded.items())[:MAX_OCCURRENCE_KEYS])

    def _save(self, occurrences: dict[str, dict[int, int]]) -> None:
        if self._path is None:
            return
        doc = {k: {str(c): n for c, n in sorted(v.items())} for k, v in sorted(occurrences.items())}
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self._path.with_suffix(".tmp")
            temporary.write_text(json.dumps(doc, indent=1) + "\n")
            os.replace(temporary, self._path)
        except OSError as exc:
            self._once("state", "cannot keep XID occurrences in %s (%s); they are kept in memory only", self._path, exc)


def _with_xids(g: GpuReading, xids: dict[int, int]) -> GpuReading:
    return dataclasses.replace(g, xid_errors=xids)
