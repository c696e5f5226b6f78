"""The simulator's fault kinds: the registry that maps each kind's name to its checks and effect (one module each).

The engine and the scenario reader look kinds up here; nothing else names a kind. To add one, see "Adding a fault
kind" in docs/simulator.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, get_args

from gpulens.exporter.sim.faults.comm_stall import CommStall, CommStallParams
from gpulens.exporter.sim.faults.dead_profiling import DeadProfiling, DeadProfilingParams
from gpulens.exporter.sim.faults.exporter_down import ExporterDown, ExporterDownParams
from gpulens.exporter.sim.faults.fabric_congestion import FabricCongestion, FabricCongestionParams
from gpulens.exporter.sim.faults.fabric_not_ready import FabricNotReady, FabricNotReadyParams
from gpulens.exporter.sim.faults.fabric_saturation import FabricSaturation, FabricSaturationParams
from gpulens.exporter.sim.faults.gpu_lost import GpuLost, GpuLostParams
from gpulens.exporter.sim.faults.gpu_missing import GpuMissing, GpuMissingParams
from gpulens.exporter.sim.faults.hang_blocked import HangBlocked, HangBlockedParams
from gpulens.exporter.sim.faults.hang_mixed import HangMixed, HangMixedParams
from gpulens.exporter.sim.faults.hang_spinning import HangSpinning, HangSpinningParams
from gpulens.exporter.sim.faults.host_cpu_contention import HostCpuContention, HostCpuContentionParams
from gpulens.exporter.sim.faults.host_memory_pressure import HostMemoryPressure, HostMemoryPressureParams
from gpulens.exporter.sim.faults.ib_degraded import IbDegraded, IbDegradedParams
from gpulens.exporter.sim.faults.ib_errors import IbErrors, IbErrorsParams
from gpulens.exporter.sim.faults.ib_link_down import IbLinkDown, IbLinkDownParams
from gpulens.exporter.sim.faults.ib_link_flap import IbLinkFlap, IbLinkFlapParams
from gpulens.exporter.sim.faults.idle_allocated import IdleAllocated, IdleAllocatedParams
from gpulens.exporter.sim.faults.kernel_xid import KernelXid, KernelXidParams
from gpulens.exporter.sim.faults.kind import FaultCheckError, FaultKind, FaultParams, ScenarioView
from gpulens.exporter.sim.faults.memory_leak import LEAK_TARGET_SHARE, MemoryLeak, MemoryLeakParams
from gpulens.exporter.sim.faults.nvlink_errors import NvlinkErrors, NvlinkErrorsParams
from gpulens.exporter.sim.faults.nvlink_saturation import NvlinkSaturation, NvlinkSaturationParams
from gpulens.exporter.sim.faults.nvml_hang import NvmlHang, NvmlHangParams
from gpulens.exporter.sim.faults.pcie_degraded import PcieDegraded, PcieDegradedParams
from gpulens.exporter.sim.faults.pcie_saturation import PcieSaturation, PcieSaturationParams
from gpulens.exporter.sim.faults.peermem_missing import PeermemMissing, PeermemMissingParams
from gpulens.exporter.sim.faults.power_cap import PowerCap, PowerCapParams
from gpulens.exporter.sim.faults.rank_dead import RankDead, RankDeadParams
from gpulens.exporter.sim.faults.straggler import Straggler, StragglerParams
from gpulens.exporter.sim.faults.sxid import Sxid, SxidParams
from gpulens.exporter.sim.faults.thermal_throttle import ThermalThrottle, ThermalThrottleParams
from gpulens.exporter.sim.faults.xid import Xid, XidParams

FAULT_KINDS: Final[Mapping[str, FaultKind]] = {
    k.name: k
    for k in (
        CommStall(),
        HangSpinning(),
        HangBlocked(),
        HangMixed(),
        RankDead(),
        Straggler(),
        MemoryLeak(),
        ThermalThrottle(),
        PowerCap(),
        PcieDegraded(),
        NvlinkErrors(),
        Xid(),
        KernelXid(),
        Sxid(),
        GpuLost(),
        IdleAllocated(),
        ExporterDown(),
        NvmlHang(),
        PcieSaturation(),
        NvlinkSaturation(),
        DeadProfiling(),
        IbLinkDown(),
        IbLinkFlap(),
        IbDegraded(),
        IbErrors(),
        FabricCongestion(),
        FabricSaturation(),
        HostCpuContention(),
        HostMemoryPressure(),
        GpuMissing(),
        FabricNotReady(),
        PeermemMissing(),
    )
}

# One [[faults]] table: msgspec picks the struct by its ``kind`` tag.
AnyFaultParams = (
    CommStallParams
    | HangSpinningParams
    | HangBlockedParams
    | HangMixedParams
    | RankDeadParams
    | StragglerParams
    | MemoryLeakParams
    | ThermalThrottleParams
    | PowerCapParams
    | PcieDegradedParams
    | NvlinkErrorsParams
    | XidParams
    | KernelXidParams
    | SxidParams
    | GpuLostParams
    | IdleAllocatedParams
    | ExporterDownParams
    | NvmlHangParams
    | PcieSaturationParams
    | NvlinkSaturationParams
    | DeadProfilingParams
    | IbLinkDownParams
    | IbLinkFlapParams
    | IbDegradedParams
    | IbErrorsParams
    | FabricCongestionParams
    | FabricSaturationParams
    | HostCpuContentionParams
    | HostMemoryPressureParams
    | GpuMissingParams
    | FabricNotReadyParams
    | PeermemMissingParams
)
assert set(get_args(AnyFaultParams)) == {k.params for k in FAULT_KINDS.values()}, "register each kind's params"
assert all(k.params.__struct_config__.tag == name for name, k in FAULT_KINDS.items()), "params tag != kind name"

# Each fault kind and the key that names its target.
FAULT_TARGETS: Final[Mapping[str, str]] = {name: k.target for name, k in FAULT_KINDS.items()}
# Kinds that take over their job's phase while they act, the first one winning.
PHASE_KINDS: Final = tuple(
    sorted((k for k in FAULT_KINDS.values() if k.phase_priority is not None), key=lambda k: k.phase_priority or 0)
)


def fault_kind(name: str) -> FaultKind:
    """The kind of that name (a ``KeyError`` for an unknown one; the scenario reader rejects those first)."""
    return FAULT_KINDS[name]


__all__ = [
    "FAULT_KINDS",
    "FAULT_TARGETS",
    "LEAK_TARGET_SHARE",
    "PHASE_KINDS",
    "AnyFaultParams",
    "FaultCheckError",
    "FaultKind",
    "FaultParams",
    "ScenarioView",
    "fault_kind",
]
