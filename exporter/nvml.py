"""The NVML source: ``NvmlSource`` reads every GPU of this node through NVIDIA's management library (``pynvml``).

Static facts (identity, maximum clocks and PCIe link, slowdown temperature, MIG mode, NVLink count) are read once at
start-up, dynamic values on every ``read()``, and values that change rarely (power limit, PCIe replay, ECC and
row-remapping totals, NVLink states, the MIG layout) every ``SLOW_REFRESH_S`` (10 s). The GPUs are read in parallel
on a persistent thread pool, because some NVML calls block: the PCIe throughput call samples for 20 ms (used only
where GPM does not measure PCIe). The parts live in their own modules, the only ones that import ``pynvml``: the error
choke point (``exporter.nvmlcalls``), the GPU state (``nvmlgpu``), per-device reads (``nvmldevice``), batched field
values (``nvmlfields``), GPM interval averages (``nvmlgpm``), NVLink (``nvmllinks``), MIG (``nvmlmig``) and the XID
event thread (``nvmlxid``); every call runs under a deadline (``nvmldeadline``: past it, NVML is hung). This module
assembles them into ``NodeSnapshot`` records, with where each GPU's PCIe, NVLink and profiling values came from.
"""

from __future__ import annotations

import functools
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Final

import pynvml  # noqa: TID251 (the NVML modules are the pynvml choke point)

from gpulens.clock import Clock, SystemClock
from gpulens.exporter import nvmldevice as device
from gpulens.exporter.nvmlcalls import Calls, GpuLostError, as_int, as_text, scaled, start_nvml
from gpulens.exporter.nvmlconfig import GpuConfigs
from gpulens.exporter.nvmldeadline import CallDeadline, NvmlHungError
from gpulens.exporter.nvmlfields import FI_MEMORY_TEMP, field_ids, read_field_values
from gpulens.exporter.nvmlgpm import NVLINK, PCIE, PROFILING, close_gpm, forget, open_gpm, read_gpm, sources
from gpulens.exporter.nvmlgpu import SLOW_REFRESH_S, Gpu
from gpulens.exporter.nvmllinks import LINK_STATE_REFRESH_S, count_links, nvlink_errors, read_nvlink, remote_pci_bus_id
from gpulens.exporter.nvmlmig import read_migs
from gpulens.exporter.nvmlxid import XidWatcher
from gpulens.logutil import ErrorCounter
from gpulens.model import (
    THROTTLE_REPORTED,
    GpuReading,
    LinkReading,
    MigReading,
    NodeSnapshot,
    ProcessReading,
    SourceError,
)
from gpulens.nodehardware import NodeHardware

log = logging.getLogger(__name__)

__all__ = ["LINK_STATE_REFRESH_S", "MAX_WORKERS", "SLOW_REFRESH_S", "NvmlSource"]

MAX_WORKERS: Final = 32


@dataclass(frozen=True, slots=True)
class _GpuRead:
    """Everything one read found on one GPU."""

    reading: GpuReading
    links: tuple[LinkReading, ...] = ()
    processes: tuple[ProcessReading, ...] = ()
    migs: tuple[MigReading, ...] = ()


class NvmlSource:
    """Reads the GPUs of this node through NVML; implements ``gpulens.model.GpuSource``.

    ``nvml`` is the ``pynvml`` module or a stand-in with the same functions (tests use a fake).
    Raises ``SourceError`` when NVML cannot start (no driver, no library, no permission).
    """

    def __init__(
        self,
        node: str,
        *,
        nvml: Any = pynvml,
        clock: Clock | None = None,
        max_workers: int | None = None,
        xid_events: bool = True,
        deadline: CallDeadline | None = None,
    ) -> None:
        if max_workers is not None and max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._node = node
        self._clock = clock or SystemClock()
        self._errors = ErrorCounter(log)
        self._calls = Calls(nvml, self._errors, deadline)
        start_nvml(nvml)
        try:
            self._driver_version = as_text(self._calls.call(None, "nvmlSystemGetDriverVersion"))
            self._gpus = self._open_gpus()
        except SourceError:
            self._calls.call(None, "nvmlShutdown")
            raise
        workers = max_workers or min(max(len(self._gpus), 1), MAX_WORKERS)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpulens-nvml")
        # The two PCIe throughput calls of a GPU (20 ms each) overlap with each other and with the GPU's other calls.
        self._pcie_pool = ThreadPoolExecutor(max_workers=2 * workers, thread_name_prefix="gpulens-nvml-pcie")
        self._xids = XidWatcher(self._calls, self._gpus) if xid_events else None
        self._configs = GpuConfigs(self._calls)  # persistence, ECC and fabric state (gpulens.exporter.nvmlconfig)
        self._read_lock = threading.Lock()
        self._closed = False
        log.info("NVML: %d GPU(s), driver %s", len(self._gpus), self._driver_version)

    def read(self) -> NodeSnapshot:
        """Read every GPU now. A lost GPU is reported with ``up=False``; the others are read normally."""
        with self._read_lock:
            if self._closed:
                raise SourceError("the NVML source is closed")
            timestamp = self._clock.now()
            results = list(self._pool.map(functools.partial(self._read_gpu, timestamp=timestamp), self._gpus))
            metric_sources = {gpu.uuid: sources(gpu) for gpu in self._gpus}
            configs = self._configs.read(self._gpus, self._clock.monotonic())
        return NodeSnapshot(
            node=self._node,
            timestamp=timestamp,
            source="nvml",
            gpus=tuple(r.reading for r in results),
            links=tuple(link for r in results for link in r.links),
            processes=tuple(p for r in results for p in r.processes),
            migs=tuple(m for r in results for m in r.migs),
            driver_version=self._driver_version,
            errors=self._errors.snapshot(),
            metric_sources=metric_sources,
            hardware=NodeHardware(gpus=configs),
        )

    def hung_since(self) -> float | None:
        """When (Unix seconds) an NVML call passed its deadline, or None while NVML answers (``nvmldeadline``)."""
        return self._calls.deadline.hung_since()

    def close(self) -> None:
        """Stop the XID thread and the thread pools and shut NVML down. Safe to call twice. With NVML hung, the
        threads stuck in it are left behind (daemons) and NVML is not shut down."""
        if not self._read_lock.acquire(timeout=self._calls.deadline.deadline_s):
            log.warning("NVML is hung in a read; closing without shutting it down")
            self._closed = True
            return
        try:
            if self._closed:
                return
            self._closed = True
        finally:
            self._read_lock.release()
        if self._xids is not None:
            self._xids.close()
        hung = self.hung_since() is not None
        self._pool.shutdown(wait=not hung)
        self._pcie_pool.shutdown(wait=not hung)
        if hung:
            return
        try:
            for gpu in self._gpus:
                close_gpm(self._calls, gpu)
            self._calls.call(None, "nvmlShutdown")
        except NvmlHungError:
            log.warning("NVML hung while shutting down")

    # --- start-up: the static facts ------------------------------------------------------------------------------

    def _open_gpus(self) -> list[Gpu]:
        count = as_int(self._calls.call(None, "nvmlDeviceGetCount"))
        if count is None:
            raise SourceError("NVML started but could not count the GPUs (see the log)")
        return [gpu for gpu in map(self._open_gpu, range(count)) if gpu is not None]

    def _open_gpu(self, index: int) -> Gpu | None:
        """The GPU with its static facts, or None (logged) when its identity cannot be read."""
        handle = self._calls.call(None, "nvmlDeviceGetHandleByIndex", index)
        gpu = None if handle is None else Gpu(index, handle)
        if gpu is not None:
            try:
                self._read_static(gpu)
            except GpuLostError:
                self._errors.count("nvml_gpu_lost")
        if gpu is None or gpu.lost or not gpu.uuid or not gpu.model:
            log.warning("NVML: GPU %d is lost or has no readable identity; it is not monitored", index)
            return None
        return gpu

    def _read_static(self, gpu: Gpu) -> None:
        device.read_static(self._calls, gpu)
        gpu.links = count_links(self._calls, gpu)
        gpu.remote_pci_bus_ids = tuple(remote_pci_bus_id(self._calls, gpu, link) for link in range(gpu.links))
        gpu.gpm = open_gpm(self._calls, gpu)
        _choose_fields(gpu)

    # --- every read: the dynamic values --------------------------------------------------------------------------

    def _read_gpu(self, gpu: Gpu, timestamp: float) -> _GpuRead:
        was_lost = gpu.lost
        try:
            result = self._read_live(gpu, timestamp)
        except GpuLostError:
            self._errors.count("nvml_gpu_lost")
            forget(gpu)
            gpu.slow = gpu.mig_layout = None  # read afresh once it answers again
            if not was_lost:
                log.warning("GPU %d (%s) is lost (fallen off the bus?): reported down", gpu.index, gpu.uuid)
            return _GpuRead(self._down(gpu, timestamp))
        if was_lost:
            gpu.lost = False
            log.warning("GPU %d (%s) answers again", gpu.index, gpu.uuid)
        return result

    def _down(self, gpu: Gpu, timestamp: float) -> GpuReading:
        """A lost GPU: its identity, its XID counts, no dynamic values."""
        return GpuReading(
            node=self._node,
            gpu=gpu.index,
            uuid=gpu.uuid,
            model=gpu.model,
            timestamp=timestamp,
            up=False,
            pci_bus_id=gpu.pci_bus_id,
            driver_version=self._driver_version,
            xid_errors=self._xid_counts(gpu),
        )

    def _xid_counts(self, gpu: Gpu) -> dict[int, int]:
        return {} if self._xids is None else self._xids.counts(gpu.index)

    def _read_live(self, gpu: Gpu, timestamp: float) -> _GpuRead:
        calls = self._calls
        memory = device.memory(calls, gpu, gpu.handle)  # a lost GPU stops here, before anything runs in parallel
        gpm = read_gpm(calls, gpu)  # first: a GPM metric that answers NotSupported hands its quantity back at once
        served = set() if gpu.gpm is None else gpu.gpm.quantities
        if PCIE in served:
            tx, rx = _done(gpm.get("pcie_tx")), _done(gpm.get("pcie_rx"))
        else:
            tx = self._pcie_pool.submit(device.pcie_rate, calls, gpu, pynvml.NVML_PCIE_UTIL_TX_BYTES)
            rx = self._pcie_pool.submit(device.pcie_rate, calls, gpu, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        try:
            utilization = device.utilization(calls, gpu)
            encoder = device.codec_utilization(calls, gpu, "nvmlDeviceGetEncoderUtilization")
            decoder = device.codec_utilization(calls, gpu, "nvmlDeviceGetDecoderUtilization")
            _choose_fields(gpu)
            fields, fields_time = read_field_values(calls, gpu, self._clock)
            nvlink = read_nvlink(calls, gpu, self._node, fields, fields_time, gpm if NVLINK in served else None)
            crc_flit, replay, recovery = nvlink_errors(calls, gpu, fields, fields_time)
            thermal = device.thermal(calls, gpu)
            link = device.pcie_link(calls, gpu)
            slow = device.slow_values(calls, gpu, fields_time)
            processes = device.processes(calls, gpu, self._node)
            migs = read_migs(calls, gpu, self._node, fields_time)
        finally:
            wait((tx, rx))
        reading = GpuReading(
            node=self._node,
            gpu=gpu.index,
            uuid=gpu.uuid,
            model=gpu.model,
            timestamp=timestamp,
            pci_bus_id=gpu.pci_bus_id,
            driver_version=self._driver_version,
            mig_enabled=gpu.mig_enabled,
            utilization_ratio=utilization,
            encoder_utilization_ratio=encoder,
            decoder_utilization_ratio=decoder,
            memory_used_bytes=memory.used,
            memory_total_bytes=memory.total,
            memory_reserved_bytes=memory.reserved,
            temperature_celsius=thermal.temperature_celsius,
            memory_temperature_celsius=scaled(fields.get((FI_MEMORY_TEMP, 0)), 1),
            slowdown_temperature_celsius=gpu.slowdown_temperature_celsius,
            power_watts=thermal.power_watts,
            power_limit_watts=slow.power_limit_watts,
            energy_joules_total=thermal.energy_joules_total,
            sm_clock_hertz=thermal.sm_clock_hertz,
            memory_clock_hertz=thermal.memory_clock_hertz,
            max_sm_clock_hertz=gpu.max_sm_clock_hertz,
            max_memory_clock_hertz=gpu.max_memory_clock_hertz,
            throttle_reasons=thermal.throttle_reasons,
            throttle_reasons_source=None if thermal.throttle_reasons is None else THROTTLE_REPORTED,
            pcie_tx_bytes_per_second=tx.result(),
            pcie_rx_bytes_per_second=rx.result(),
            pcie_link_generation=link.generation,
            pcie_link_generation_max=gpu.pcie_link_generation_max,
            pcie_link_width=link.width,
            pcie_link_width_max=gpu.pcie_link_width_max,
            pcie_replays_total=slow.pcie_replays,
            nvlink_tx_bytes_per_second=nvlink.tx_bytes_per_second,
            nvlink_rx_bytes_per_second=nvlink.rx_bytes_per_second,
            nvlink_links_active=nvlink.active,
            nvlink_crc_flit_errors_total=crc_flit,
            nvlink_replay_errors_total=replay,
            nvlink_recovery_errors_total=recovery,
            ecc_corrected_errors_total=slow.ecc_corrected,
            ecc_uncorrected_errors_total=slow.ecc_uncorrected,
            remapped_rows_correctable=slow.rows_correctable,
            remapped_rows_uncorrectable=slow.rows_uncorrectable,
            remapped_rows_pending=slow.rows_pending,
            remapped_rows_failure=slow.rows_failure,
            sm_active_ratio=gpm.get("sm_active") if PROFILING in served else None,
            tensor_active_ratio=gpm.get("tensor_active") if PROFILING in served else None,
            dram_active_ratio=gpm.get("dram_active") if PROFILING in served else None,
            xid_errors=self._xid_counts(gpu),
        )
        return _GpuRead(reading, links=nvlink.links, processes=processes, migs=migs)


def _done(value: float | None) -> Future[float | None]:
    """A value that GPM has already measured, in the shape of a pending 20 ms PCIe sample."""
    future: Future[float | None] = Future()
    future.set_result(value)
    return future


def _choose_fields(gpu: Gpu) -> None:
    """The GPU's batch of field values: without the NVLink counters where GPM measures NVLink, and without the error
    totals the driver refuses."""
    counters = gpu.gpm is None or NVLINK not in gpu.gpm.quantities
    choice = (counters, frozenset(gpu.nvlink_errors_per_link))
    if choice != gpu.fields_choice:
        gpu.fields_choice = choice
        gpu.fields = field_ids(gpu.links, nvlink_counters=counters, per_link_errors=choice[1])
