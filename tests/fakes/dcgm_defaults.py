"""dcgm-exporter pages as a default install serves them: the 26 fields of its default counters files (4.5/4.8's
``default-counters.csv`` and ``dcp-metrics-included.csv``: 25 series and the driver version as a label), in either
name generation, with a family's HELP and TYPE lines as dcgm-exporter writes them. No clock-event reasons (field 112),
no power limit, no slowdown temperature, no maximum clock: what gpulens must make do with.

``default_page`` renders one; tests/fixtures/dcgm/default_counters_h100.prom is one such page, written out (a GPU
thermally throttled, one power capped, one healthy) so that a reader can see what the tests read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gpulens.dcgmfields import BY_NAME

H100: Final = "NVIDIA H100 80GB HBM3"
DRIVER: Final = "570.124.06"
# (name in the default counters file, type, HELP): the default counters in the file's order.
DEFAULT_FAMILIES: Final = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", "Ratio of cycles the device memory interface is active sending or "
     "receiving data."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", "The rate of data transmitted over the PCIe bus - including both protocol "
     "headers and data payloads - in bytes per second."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", "The rate of data received over the PCIe bus - including both protocol "
     "headers and data payloads - in bytes per second."),
)  # fmt: skip
DEFAULT_FIELD_COUNT: Final = len(DEFAULT_FAMILIES) + 1  # and DCGM_FI_DRIVER_VERSION, a label on every series


@dataclass(frozen=True)
class Gpu:
    """One GPU's values on a default page, in dcgm-exporter's units."""

    index: int
    sm_mhz: float = 1980
    temp: float = 66
    power: float = 610.0
    util: float = 100
    pod: str | None = None
    energy_mj: int = 9_876_543_210

    @property
    def uuid(self) -> str:
        return f"GPU-7d1c0e2a-55b3-4c8e-9a41-0b6f3e2d8c{self.index:02d}"

    def values(self) -> dict[str, float]:
        busy = self.util / 100
        return {
            "DCGM_FI_DEV_SM_CLOCK": self.sm_mhz,
            "DCGM_FI_DEV_MEM_CLOCK": 2619,
            "DCGM_FI_DEV_MEMORY_TEMP": self.temp + 6,
            "DCGM_FI_DEV_GPU_TEMP": self.temp,
            "DCGM_FI_DEV_POWER_USAGE": self.power,
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": self.energy_mj,
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0,
            "DCGM_FI_DEV_GPU_UTIL": self.util,
            "DCGM_FI_DEV_MEM_COPY_UTIL": round(40 * busy),
            "DCGM_FI_DEV_ENC_UTIL": 0,
            "DCGM_FI_DEV_DEC_UTIL": 0,
            "DCGM_FI_DEV_XID_ERRORS": 0,
            "DCGM_FI_DEV_FB_FREE": 20951,
            "DCGM_FI_DEV_FB_USED": 60000,
            "DCGM_FI_DEV_FB_RESERVED": 609,
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 0,
            "DCGM_FI_DEV_VGPU_LICENSE_STATUS": 0,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(0.98 * busy, 6),
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(0.41 * busy, 6),
            "DCGM_FI_PROF_DRAM_ACTIVE": round(0.37 * busy, 6),
            "DCGM_FI_PROF_PCIE_TX_BYTES": 183_412_004,
            "DCGM_FI_PROF_PCIE_RX_BYTES": 392_004_118,
        }


def current_name(name: str) -> str:
    """DCGM 4.6's name of a default counter (``DCGM_FI_DEV_GPU_UTIL`` -> ``..._GPU_UTIL_RATIO``); names gpulens does
    not read (the vGPU license status) stay as they are."""
    spec = BY_NAME.get(name)
    return name if spec is None else spec.field.current


def default_page(
    gpus: Sequence[Gpu],
    *,
    host: str = "gpu-node-41",
    current_names: bool = False,
    extra: Sequence[str] = (),
) -> str:
    """A default-counters page of ``gpus`` (``current_names``: DCGM 4.6's names); ``extra`` lines are appended."""
    lines: list[str] = []
    for name, kind, help_text in DEFAULT_FAMILIES:
        written = current_name(name) if current_names else name
        lines += [f"# HELP {written} {help_text}", f"# TYPE {written} {kind}"]
        for g in gpus:
            labels = (
                f'gpu="{g.index}",UUID="{g.uuid}",pci_bus_id="00000000:{0x18 + 16 * g.index:02X}:00.0",'
                f'device="nvidia{g.index}",modelName="{H100}",Hostname="{host}",DCGM_FI_DRIVER_VERSION="{DRIVER}"'
            )
            if g.pod:
                labels += f',container="trainer",namespace="ml",pod="{g.pod}"'
            value = g.values()[name]
            lines.append(
                f"{written}{{{labels}}} {value:g}" if isinstance(value, float) else f"{written}{{{labels}}} {value}"
            )
    return "\n".join([*lines, *extra]) + "\n"
