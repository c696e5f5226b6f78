"""A source that returns snapshots built from fixed records: the hardware edge, for server and rendering tests."""

from __future__ import annotations

import dataclasses
import threading

from gpulens.clock import Clock, ManualClock
from gpulens.model import GpuJob, GpuReading, LinkReading, MigReading, NodeSnapshot, ProcessReading, SourceError

GIB = 1024**3


def h100(node: str, index: int, t: float, **changes: object) -> GpuReading:
    """A busy H100 SXM5 reading with every field set ; ``changes`` override some."""
    values: dict[str, object] = {
        "node": node,
        "gpu": index,
        "uuid": f"GPU-{node}-{index:04d}-0000-0000-000000000000",
        "model": "NVIDIA H100 80GB HBM3",
        "timestamp": t,
        "up": True,
        "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "driver_version": "550.54.15",
        "mig_enabled": False,
        "utilization_ratio": 0.97,
        "memory_used_bytes": 70 * GIB,
        "memory_total_bytes": 80 * GIB,
        "memory_reserved_bytes": GIB // 2,
        "temperature_celsius": 61.0,
        "memory_temperature_celsius": 70.0,
        "slowdown_temperature_celsius": 87.0,
        "power_watts": 612.5,
        "power_limit_watts": 700.0,
        "energy_joules_total": 1.25e7,
        "sm_clock_hertz": 1.98e9,
        "memory_clock_hertz": 2.619e9,
        "max_sm_clock_hertz": 1.98e9,
        "max_memory_clock_hertz": 2.619e9,
        "throttle_reasons": 0x4,
        "pcie_tx_bytes_per_second": 1.2e9,
        "pcie_rx_bytes_per_second": 2.4e9,
        "pcie_link_generation": 5,
        "pcie_link_generation_max": 5,
        "pcie_link_width": 16,
        "pcie_link_width_max": 16,
        "pcie_replays_total": 3,
        "nvlink_tx_bytes_per_second": 1.5e11,
        "nvlink_rx_bytes_per_second": 1.4e11,
        "nvlink_links_active": 18,
        "nvlink_crc_flit_errors_total": 0,
        "nvlink_replay_errors_total": 1,
        "nvlink_recovery_errors_total": 0,
        "ecc_corrected_errors_total": 2,
        "ecc_uncorrected_errors_total": 0,
        "remapped_rows_correctable": 0,
        "remapped_rows_uncorrectable": 0,
        "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "sm_active_ratio": 0.81,
        "tensor_active_ratio": 0.55,
        "dram_active_ratio": 0.62,
        "encoder_utilization_ratio": 0.12,
        "decoder_utilization_ratio": 0.34,
        "sm_occupancy_ratio": 0.41,
        "fp64_active_ratio": 0.02,
        "fp32_active_ratio": 0.18,
        "fp16_active_ratio": 0.07,
        "power_violation_seconds_total": 12.5,
        "thermal_violation_seconds_total": 3.25,
        "sync_boost_violation_seconds_total": 0.0,
        "board_limit_violation_seconds_total": 1.5,
        "low_utilization_violation_seconds_total": 640.0,
        "reliability_violation_seconds_total": 0.0,
        "ecc_corrected_errors_persistent_total": 7,
        "ecc_uncorrected_errors_persistent_total": 0,
        "retired_pages_single_bit_total": 2,
        "retired_pages_double_bit_total": 0,
        "retired_pages_pending": False,
        "nvlink_crc_data_errors_total": 3,
        "health_status": 0,
        "p2p_peers_ok": 7,
        "throttle_reasons_source": "reported",
        "xid_errors": {},
    }
    missing = {f.name for f in dataclasses.fields(GpuReading)} - values.keys()
    if missing:  # a new GpuReading field: give it a plausible H100 value above, so the round-trip tests cover it
        raise TypeError(f"h100() sets no value for {', '.join(sorted(missing))}")
    values.update(changes)
    return GpuReading(**values)  # type: ignore[arg-type]


def node_snapshot(node: str = "node-00", gpus: int = 8, t: float = 1_700_000_000.0) -> NodeSnapshot:
    readings = tuple(h100(node, i, t) for i in range(gpus))
    links = tuple(LinkReading(node, g.gpu, g.uuid, link, True, 8.3e9, 7.7e9) for g in readings for link in range(18))
    processes = tuple(
        ProcessReading(node, g.gpu, g.uuid, 4000 + g.gpu, 69 * GIB, "python", "alice", "4242") for g in readings
    )
    jobs = tuple(GpuJob(node, g.gpu, g.uuid, "4242", "alice") for g in readings)
    return NodeSnapshot(
        node=node,
        timestamp=t,
        source="static",
        gpus=readings,
        links=links,
        processes=processes,
        jobs=jobs,
        driver_version="550.54.15",
    )


class StaticSource:
    """Returns ``snapshot`` stamped with the clock's time; ``fail`` makes reads raise, ``hold`` blocks them."""

    def __init__(self, snapshot: NodeSnapshot, clock: Clock | None = None) -> None:
        self.snapshot = snapshot
        self.clock = clock or ManualClock()
        self.fail: Exception | None = None
        self.hold = threading.Event()
        self.hold.set()
        self.reads = 0
        self.closed = False

    def read(self) -> NodeSnapshot:
        self.hold.wait(10)
        if self.fail is not None:
            raise self.fail
        self.reads += 1
        return self.snapshot.replace(timestamp=self.clock.now())

    def close(self) -> None:
        self.closed = True


class MigSnapshotSource(StaticSource):
    def __init__(self) -> None:
        snap = node_snapshot(gpus=1)
        gpu = snap.gpus[0]
        migs = (MigReading(gpu.node, 0, gpu.uuid, "MIG-aaaa", 1, 0, "3g.40gb", 10 * GIB, 40 * GIB),)
        super().__init__(snap.replace(migs=migs))


__all__ = ["GIB", "MigSnapshotSource", "SourceError", "StaticSource", "h100", "node_snapshot"]
