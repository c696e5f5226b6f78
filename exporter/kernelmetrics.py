"""The kernel log's families of /metrics, rendered from a snapshot's ``kernel`` view (``gpulens.kernelmodel``).

- ``gpulens_node_xid_errors_total{node, pci_bus_id, xid}``: Xids the kernel log reports on a PCI address that no
  GPU of the source has (a GPU NVML cannot open, or lost before the exporter started);
- ``gpulens_nvswitch_sxid_errors_total{node, pci_bus_id, sxid, severity}``: NVSwitch SXids, one per event, with
  the catalogue's severity (``fatal``, ``non-fatal``);
- ``gpulens_gpu_xid_action_info{node, gpu, uuid, model, xid, name, action} 1`` for each XID a GPU has reported since
  the exporter started: the catalogue's name and the action (escalated to ``hardware-inspection`` by repeats), to
  join on ``node, gpu, uuid, xid`` with ``gpulens_gpu_xid_errors_total``;
- ``gpulens_gpu_xid_occurrences{node, gpu, uuid, model, xid}``: how often the XID has happened on that GPU, counted
  across exporter restarts and reboots (the exporter's state directory).
"""

from __future__ import annotations

from collections.abc import Iterator

from gpulens.exporter.promfamily import Family, render_labels
from gpulens.metriccatalogue import GPU_LABELS
from gpulens.model import NodeSnapshot
from gpulens.xidcatalogue import sxid_severity, xid_name


def kernel_families(snapshot: NodeSnapshot) -> Iterator[Family]:
    view = snapshot.kernel
    if view is None:
        return
    node = Family(
        "gpulens_node_xid_errors_total",
        "XID events the kernel log reports on a PCI address that matches no GPU the exporter reads.",
        labels=["node", "pci_bus_id", "xid"],
        type="counter",
    )
    for address, code, count in view.node_xids:
        node.add_metric([snapshot.node, address, str(code)], count)
    yield node
    sxids = Family(
        "gpulens_nvswitch_sxid_errors_total",
        "NVSwitch SXid events from the kernel log, one per event, by switch PCI address, code and severity.",
        labels=["node", "pci_bus_id", "sxid", "severity"],
        type="counter",
    )
    for address, code, count in view.sxids:
        sxids.add_metric([snapshot.node, address, str(code), sxid_severity(code)], count)
    yield sxids
    prefixes = {g.uuid: render_labels(GPU_LABELS, [g.node, str(g.gpu), g.uuid, g.model]) for g in snapshot.gpus}
    info = Family(
        "gpulens_gpu_xid_action_info",
        "The name of each XID a GPU reported and what to do about it (none, check-application, reset-gpu, reboot, "
        "hardware-inspection); always 1.",
        labels=[*GPU_LABELS, "xid", "name", "action"],
    )
    occurrences = Family(
        "gpulens_gpu_xid_occurrences",
        "XID events on the GPU counted across exporter restarts and reboots (the exporter's state directory).",
        labels=[*GPU_LABELS, "xid"],
    )
    for action in view.actions:
        prefix = prefixes.get(action.uuid)
        if prefix is None:
            continue
        labels = render_labels(("xid", "name", "action"), (str(action.xid), xid_name(action.xid), action.action))
        info.add_rendered(f"{prefix},{labels}", 1)
        occurrences.add_rendered(f'{prefix},xid="{action.xid}"', action.occurrences)
    yield info
    yield occurrences
