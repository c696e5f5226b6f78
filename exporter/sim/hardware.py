"""A simulated node's hardware against what it should be (``NodeSnapshot.hardware``), as the agent's hardware reader
and the NVML source report it on a real node.

Every GPU of the node is on its PCI bus; those a ``gpu_missing`` fault hides have no reading and are listed missing.
A node whose GPU model has NVSwitches runs nv-fabricmanager and has every GPU registered with the NVLink fabric
(``fabric_not_ready`` stops both); a node with RDMA ports has ``nvidia_peermem`` loaded (``peermem_missing`` unloads
it). Every GPU runs with persistence mode and ECC on, and the simulated agent is given no ``--expect-*`` flags.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpulens.exporter.sim.faults import FAULT_KINDS
from gpulens.exporter.sim.gpus import SimGpu
from gpulens.exporter.sim.specs import FaultSpec, NodeSpec
from gpulens.exporter.sim.stepstate import PlumbingState
from gpulens.fabricmodel import NicReading
from gpulens.nodehardware import (
    FABRIC_COMPLETED,
    FABRIC_NOT_STARTED,
    GpuConfig,
    NodeHardware,
    ib_ports_active,
    sysfs_bus_id,
)


def _bus(bus_id: str) -> str:
    return sysfs_bus_id(bus_id) or bus_id


def node_hardware(
    spec: NodeSpec,
    gpus: Sequence[SimGpu],
    missing: Sequence[SimGpu],
    faults: Sequence[FaultSpec],
    t: float,
    nics: Sequence[NicReading],
) -> NodeHardware:
    """The node's hardware at ``t``: ``missing`` are its GPUs without a reading, ``faults`` those naming the node."""
    plumbing = PlumbingState()
    for fault in faults:
        if fault.active(t):
            FAULT_KINDS[fault.kind].plumbing(fault, t, plumbing)
    switches = spec.model.nvswitches
    state = None if not switches else FABRIC_COMPLETED if plumbing.fabric_ready else FABRIC_NOT_STARTED
    ready = None if state is None else plumbing.fabric_ready
    absent = {g.ref.index for g in missing}
    return NodeHardware(
        pci_gpus=tuple(sorted(_bus(g.pci_bus_id) for g in gpus)),
        missing_gpus=tuple(sorted(_bus(g.pci_bus_id) for g in missing)),
        nvml_gpus=len(gpus) - len(missing),
        nvswitches=switches,
        fabric_manager_running=plumbing.fabric_ready if switches else None,
        peermem_loaded=plumbing.peermem_loaded if nics else None,
        ib_ports_active=ib_ports_active(nics),
        gpus=tuple(GpuConfig(g.ref.index, g.uuid, True, True, state, ready) for g in gpus if g.ref.index not in absent),
    )
