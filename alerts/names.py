"""The builtin rules' names, a contract: the dashboard, the docs, users' routes and silences refer to them.

Only names and the XID codes the ``XidError`` rule pages on live here, so that the checks, the PromQL builders and the
round pre-filters can name rules without importing the catalogue (``alerts.catalogue``), which imports them all.
"""

from __future__ import annotations

from typing import Final

from gpulens.xidcatalogue import PAGING_CODES, XIDS

MEMORY_SATURATED: Final = "GpuMemorySaturated"
THERMAL_THROTTLING: Final = "GpuThermalThrottling"
POWER_CAPPED: Final = "GpuPowerCapped"
HW_POWER_BRAKE: Final = "GpuHwPowerBrake"
PCIE_SATURATED: Final = "PcieBandwidthSaturated"
NVLINK_SATURATED: Final = "NvlinkBandwidthSaturated"
PCIE_DEGRADED: Final = "PcieLinkDegraded"
NVLINK_ERRORS: Final = "NvlinkErrors"
COMMUNICATION_STALL: Final = "CommunicationStall"
JOB_STRAGGLER: Final = "JobStraggler"
IDLE_ALLOCATED: Final = "GpuIdleAllocated"
JOB_INEFFICIENT: Final = "JobInefficient"
XID_ERROR: Final = "XidError"
ECC_UNCORRECTABLE: Final = "EccUncorrectable"
GPU_LOST: Final = "GpuLost"
EXPORTER_DOWN: Final = "ExporterDown"
WATCHDOG: Final = "Watchdog"
IB_LINK_DOWN: Final = "IbLinkDown"
IB_LINK_FLAPPING: Final = "IbLinkFlapping"
IB_LINK_DEGRADED: Final = "IbLinkDegraded"
IB_ERRORS: Final = "IbErrors"
FABRIC_CONGESTION: Final = "FabricCongestion"
FABRIC_SATURATED: Final = "FabricBandwidthSaturated"
JOB_INPUT_BOUND: Final = "JobInputBound"
HOST_MEMORY_PRESSURE: Final = "HostMemoryPressure"
HOST_CPU_CONTENTION: Final = "HostCpuContention"
GPU_MISSING: Final = "GpuMissing"
IB_PORT_MISSING: Final = "IbPortMissing"
IB_PORT_SLOW: Final = "IbPortSlow"
GPU_FABRIC_NOT_READY: Final = "GpuFabricNotReady"
GPU_CONFIG_DRIFT: Final = "GpuConfigDrift"
GPU_DRIVER_HUNG: Final = "GpuDriverHung"
NVSWITCH_FATAL_SXID: Final = "NvswitchFatalSxid"
JOB_COMMUNICATION_SLOW: Final = "JobCommunicationSlow"

# The XIDs operators page on (docs/domain.md §4) and what each is called: the XID catalogue's (docs/xid.md).
PAGING_XIDS: Final = PAGING_CODES
XID_MEANINGS: Final = {x.code: x.name for x in XIDS}
