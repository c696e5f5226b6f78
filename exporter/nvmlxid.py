"""XID errors from NVML: an event set waited on by a daemon thread, counted per GPU and XID code."""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Sequence
from typing import Any, Final

import pynvml  # noqa: TID251 (the NVML modules are the pynvml choke point)

from gpulens.exporter.nvmlcalls import QUIET_TIMEOUT, TIMEOUT, Calls
from gpulens.exporter.nvmldeadline import NvmlHungError
from gpulens.exporter.nvmlgpu import Gpu
from gpulens.logutil import LogOnce

log = logging.getLogger(__name__)

XID_WAIT_MS: Final = 500
XID_RETRY_S: Final = 1.0


def _address(handle: Any) -> int | None:
    """The address an NVML device handle points at: the same device gives the same address."""
    return ctypes.cast(handle, ctypes.c_void_p).value


class XidWatcher:
    """Counts XID errors per GPU and XID code, from an NVML event set waited on by a daemon thread."""

    def __init__(self, calls: Calls, gpus: Sequence[Gpu]) -> None:
        self._calls = calls
        self._counts: dict[int, dict[int, int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._by_address: dict[int, int] = {}
        self._once = LogOnce(log)
        self._event_set: Any = calls.call(None, "nvmlEventSetCreate", unsupported="xid_events_unsupported")
        if self._event_set is None:
            return
        for gpu in gpus:
            _, code = calls.attempt(
                None,
                "nvmlDeviceRegisterEvents",
                gpu.handle,
                pynvml.nvmlEventTypeXidCriticalError,
                self._event_set,
                unsupported="xid_events_unsupported",
            )
            address = _address(gpu.handle)
            if code is None and address is not None:
                self._by_address[address] = gpu.index
        if not self._by_address:
            self._free()
            return
        self._thread = threading.Thread(target=self._run, name="gpulens-nvml-xid", daemon=True)
        self._thread.start()

    def counts(self, gpu: int) -> dict[int, int]:
        with self._lock:
            return dict(self._counts.get(gpu, {}))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=XID_WAIT_MS / 1000 + 5)
            if self._thread.is_alive():
                log.warning("the NVML XID event thread did not stop; leaving its event set allocated")
                return
        if self._event_set is not None:
            self._free()

    def _free(self) -> None:
        self._calls.call(None, "nvmlEventSetFree", self._event_set)
        self._event_set = None

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, code = self._calls.attempt(
                    None, "nvmlEventSetWait_v2", self._event_set, XID_WAIT_MS, quiet=QUIET_TIMEOUT
                )
            except NvmlHungError:  # NVML is hung: wait for it (the poller reports it)
                self._stop.wait(XID_RETRY_S)
                continue
            if code is None:
                self._record(data)
            elif code != TIMEOUT:
                self._stop.wait(XID_RETRY_S)  # the failure is counted; do not spin on it

    def _record(self, data: Any) -> None:
        if int(data.eventType) != pynvml.nvmlEventTypeXidCriticalError:
            return
        address = _address(data.device)
        gpu = None if address is None else self._by_address.get(address)
        if gpu is None:
            return
        xid = int(data.eventData)
        with self._lock:
            per_gpu = self._counts.setdefault(gpu, {})
            per_gpu[xid] = per_gpu.get(xid, 0) + 1
        self._once(f"xid:{gpu}:{xid}", "XID %d on GPU %d (repeats are counted, not logged)", xid, gpu)
