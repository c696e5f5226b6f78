"""The builtin rules of the node's hardware against what it should be: GPUs and InfiniBand ports missing, ports
slow, fatal NVSwitch SXids, the NVLink fabric not ready, GPU settings apart from the cluster's majority.

Part of ``alerts.catalogue`` (which lists them after the fabric rules); the same conventions hold. Their checks live
in ``alerts.hardwarechecks``; what they read comes from the agent's hardware reader (docs/exporter.md, "Expected
hardware"). ``docs/alerts.md`` explains each, and why each has its severity.
"""

from __future__ import annotations

from typing import Final

from gpulens.alerts import hardwarechecks
from gpulens.alerts import promqlhardware as promql
from gpulens.alerts.base import AlertRule
from gpulens.alerts.definition import Definition, RoundPlan
from gpulens.alerts.names import (
    GPU_CONFIG_DRIFT,
    GPU_FABRIC_NOT_READY,
    GPU_MISSING,
    IB_PORT_MISSING,
    IB_PORT_SLOW,
    NVSWITCH_FATAL_SXID,
)

MINUTE: Final = 60.0

HARDWARE_DEFINITIONS: Final[tuple[Definition, ...]] = (
    Definition(
        AlertRule(
            name=GPU_MISSING,
            severity="critical",
            for_s=MINUTE,
            scope="node",
            meaning="An NVIDIA GPU is on the node's PCI bus but the driver never opened it (labelled with its "
            "`pci_bus_id`), or the node has fewer GPUs than it should (`--expect-gpus`). This is the GPU lost before "
            "the agent started, which GpuLost cannot see: NVML does not list it at all.",
            action="Drain the node; read the kernel log's NVRM lines for the address. A reset or reboot may bring the "
            "GPU back; one that stays missing needs its board, riser or power checked.",
        ),
        check=hardwarechecks.gpu_missing,
        round=RoundPlan(whole=False, hardware=True),
        export=promql.gpu_missing,
    ),
    Definition(
        AlertRule(
            name=IB_PORT_MISSING,
            severity="critical",
            for_s=5 * MINUTE,
            scope="node",
            meaning="Fewer InfiniBand ports are up (ACTIVE and LinkUp) than the node should have "
            "(`--expect-ib-ports`): a port that never came up, or an HCA the kernel did not enumerate, which "
            "IbLinkDown (a port seen up before) cannot see. Multi-node jobs placed here lose a rail.",
            action="Drain the node for multi-node work; check ibstat, the cable and the switch port, and whether the "
            "HCA shows on the PCI bus (lspci) at all.",
        ),
        check=hardwarechecks.ib_port_missing,
        round=RoundPlan(whole=False, hardware=True),
        export=promql.ib_port_missing,
    ),
    Definition(
        AlertRule(
            name=IB_PORT_SLOW,
            severity="warning",
            for_s=5 * MINUTE,
            meaning="An InfiniBand port is up below the rate the node should run at (`--expect-ib-rate-gbps`, 1 % "
            "tolerance), even if it never ran faster (IbLinkDegraded compares with the port's own best). Every "
            "collective crossing it runs at its pace.",
            action="Reseat or replace the cable or transceiver, then reset the port: a link retrains at its full rate "
            "only after a reset.",
        ),
        check=hardwarechecks.ib_port_slow,
        round=RoundPlan(whole=False, hardware=True),
        export=promql.ib_port_slow,
    ),
    Definition(
        AlertRule(
            name=GPU_FABRIC_NOT_READY,
            severity="critical",
            for_s=5 * MINUTE,
            meaning="On an NVSwitch system, a GPU is not registered with the NVLink fabric (NVML's fabric state is "
            "not completed, or completed with an error), or nv-fabricmanager is not running (`service` label). CUDA "
            "fails to start on such GPUs (cudaErrorSystemNotReady). `for` leaves the fabric manager the minutes it "
            "takes after a boot.",
            action="Check nv-fabricmanager (systemctl status nvidia-fabricmanager, its log); its version must match "
            "the driver's exactly. Restart it, or reboot the node if the GPUs stay unregistered.",
        ),
        check=hardwarechecks.gpu_fabric_not_ready,
        round=RoundPlan(whole=False, hardware=True),
        export=promql.gpu_fabric_not_ready,
    ),
    Definition(
        AlertRule(
            name=NVSWITCH_FATAL_SXID,
            severity="critical",
            for_s=0.0,
            scope="node",
            meaning="An NVSwitch of the node reported a fatal SXid in the kernel log since the agent started "
            "(`pci_bus_id` is the switch, `sxid` the code; docs/xid.md names each and its action). A fatal SXid "
            "leaves the switch or its NVLinks in need of a reset: the jobs whose GPUs talk through it fail or hang. "
            "It fires until the agent starts afresh, which a reboot (the usual fix) does.",
            action="Drain the node; reset the GPUs and switches (nvidia-smi -r with the fabric manager stopped) or "
            "reboot, as the SXid's action says. One that returns after a reset needs the baseboard inspected.",
        ),
        check=hardwarechecks.nvswitch_fatal_sxid,
        round=RoundPlan(whole=False, hardware=True),
        export=promql.nvswitch_fatal_sxid,
    ),
    Definition(
        AlertRule(
            name=GPU_CONFIG_DRIFT,
            severity="warning",
            for_s=15 * MINUTE,
            scope="node",
            thresholds={"min_peers": 3.0},
            meaning="A node (or one of its GPUs) runs a setting the cluster's majority does not: the driver version, "
            "nvidia_peermem loaded (nodes with RDMA ports), persistence mode or ECC mode (per GPU, among the GPUs of "
            "its model). The majority is the value more than half of the nodes (GPUs) hold, among at least "
            "`min_peers`; without one nothing fires. Labels: `setting`, `value`, `majority`.",
            action="Bring the node in line with its peers (the driver package, modprobe nvidia_peermem, "
            "nvidia-smi -pm 1, nvidia-smi -e 1 and a reboot) or drain it until then; during a rolling upgrade the "
            "nodes not yet upgraded fire once the upgraded ones are the majority.",
        ),
        check=hardwarechecks.gpu_config_drift,
        round=RoundPlan(whole=False, hardware=True),
        export=promql.gpu_config_drift,
    ),
)
HARDWARE_RULES: Final[tuple[AlertRule, ...]] = tuple(d.rule for d in HARDWARE_DEFINITIONS)
