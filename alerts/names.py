"""The builtin rules' names, a contract: the dashboard, the docs, users' routes and silences refer to them.

Only names and the XID codes the ``XidError`` rule pages on live here, so that the checks, the PromQL builders and the
round pre-filters can name rules without importing the catalogue (``alerts.catalogue``), which imports them all.
"""

from __future__ import annotations

from typing import Final

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
GPU_DRIVER_HUNG: Final = "GpuDriverHung"

# The XIDs operators page on (docs/domain.md §4) and what each means.
PAGING_XIDS: Final = (48, 62, 64, 74, 79, 94, 95, 119, 120)
XID_MEANINGS: Final = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
