"""The node's hardware families of /metrics (``gpulens_node_*`` and the GPU settings ``gpulens_gpu_*`` beside them),
rendered from a snapshot's ``hardware`` (``gpulens.nodehardware``); nothing where the source did not read it.

The node families carry ``node``; ``gpulens_node_gpu_missing`` adds ``pci_bus_id``; the GPU settings carry ``node,
gpu, uuid, model`` like every GPU family. An unknown value is omitted. These are what ``GpuMissing``, ``IbPortMissing``,
``IbPortSlow``, ``GpuFabricNotReady`` and ``GpuConfigDrift`` read in PromQL (``alerts/promql.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from gpulens.exporter.promfamily import Family
from gpulens.model import NodeSnapshot
from gpulens.nodehardware import FABRIC_STATES, ib_ports_active

GPU_LABELS: Final = ("node", "gpu", "uuid", "model")

# NodeHardware field -> (family, help); node gauges, in the order they are rendered
NODE_GAUGES: Final[tuple[tuple[str, str, str], ...]] = (
    ("pci_gpus", "gpulens_node_pci_gpus", "NVIDIA GPUs on the node's PCI bus (display and 3D classes), driver or not."),
    ("nvml_gpus", "gpulens_node_nvml_gpus", "GPUs the source opened (NVML), lost ones included."),
    ("gpus_expected", "gpulens_node_gpus_expected", "The GPUs the node should have (--expect-gpus)."),
    ("ib_ports_expected", "gpulens_node_ib_ports_expected", "InfiniBand ports that should be up (--expect-ib-ports)."),
    (
        "ib_rate_expected_bytes_per_second",
        "gpulens_node_ib_rate_expected_bytes_per_second",
        "The rate each InfiniBand port should run at (--expect-ib-rate-gbps, in bytes per second).",
    ),
    ("nvswitches", "gpulens_node_nvswitches", "NVSwitches on the node's PCI bus (vendor 0x10de, class 0x0680)."),
    (
        "fabric_manager_running",
        "gpulens_node_fabric_manager_up",
        "1 while nv-fabricmanager runs (its PID file's process), else 0; NVSwitch nodes only.",
    ),
    (
        "peermem_loaded",
        "gpulens_node_peermem_loaded",
        "1 while the nvidia_peermem module (GPUDirect RDMA) is loaded, else 0; nodes with RDMA ports only.",
    ),
)
# GpuConfig field -> (family, help)
GPU_GAUGES: Final[tuple[tuple[str, str, str], ...]] = (
    ("persistence_mode", "gpulens_gpu_persistence_mode", "1 while the GPU's persistence mode is enabled, else 0."),
    ("ecc_enabled", "gpulens_gpu_ecc_enabled", "1 while the GPU's ECC mode is enabled (current mode), else 0."),
    (
        "fabric_ready",
        "gpulens_gpu_fabric_ready",
        "1 once the GPU is registered with the NVLink fabric (state completed, status success), else 0; "
        "NVSwitch systems only.",
    ),
)


def hardware_families(snapshot: NodeSnapshot) -> Iterator[Family]:
    """The hardware families of ``snapshot`` (empty ones render nothing)."""
    hw = snapshot.hardware
    node = snapshot.node
    for field, name, help_text in NODE_GAUGES:
        family = Family(name, help_text, labels=("node",))
        value = None if hw is None else getattr(hw, field)
        if isinstance(value, tuple):
            value = len(value)
        if value is not None:
            family.add_metric((node,), value)
        yield family
    active = Family(
        "gpulens_node_ib_ports_active",
        "InfiniBand ports up (ACTIVE and LinkUp): what --expect-ib-ports is compared with.",
        labels=("node",),
    )
    missing = Family(
        "gpulens_node_gpu_missing",
        "1 for a GPU on the PCI bus that the source did not open (NVML never saw it); by its PCI address.",
        labels=("node", "pci_bus_id"),
    )
    state = Family(
        "gpulens_gpu_fabric_state",
        "The GPU's NVLink fabric registration as NVML numbers it: 1 not started, 2 in progress, 3 completed.",
        labels=GPU_LABELS,
    )
    if hw is not None:
        count = hw.ib_ports_active if hw.ib_ports_active is not None else ib_ports_active(snapshot.nics)
        active.add_metric((node,), count)
        for bus_id in hw.missing_gpus:
            missing.add_metric((node, bus_id), 1)
    yield from (active, missing)
    configs = () if hw is None else hw.gpus
    models = {g.uuid: g.model for g in snapshot.gpus}
    for field, name, help_text in GPU_GAUGES:
        family = Family(name, help_text, labels=GPU_LABELS)
        for c in configs:
            value = getattr(c, field)
            if value is not None:
                family.add_metric((node, str(c.gpu), c.uuid, models.get(c.uuid, "")), value)
        yield family
    for c in configs:
        if c.fabric_state is not None:
            state.add_metric(
                (node, str(c.gpu), c.uuid, models.get(c.uuid, "")), FABRIC_STATES.index(c.fabric_state) + 1
            )
    yield state
