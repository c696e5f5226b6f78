"""What the kernel log and the XID ledger add to a node's snapshot: Xids on PCI addresses that match no GPU, NVSwitch
SXids, and each GPU's XID actions (the catalogue's, escalated by repeats across reboots).

Exported in ``/metrics`` (``gpulens.exporter.kernelmetrics``); not in the snapshot JSON document, whose GPUs carry
the merged XID counts in ``xid_errors`` as before.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class XidAction:
    """The action for one XID on one GPU: ``occurrences`` counts it on that GPU across restarts and reboots."""

    uuid: str
    xid: int
    action: str
    occurrences: int


@dataclass(frozen=True, slots=True)
class KernelView:
    """``node_xids``: (pci_bus_id, xid, count) for Xids on addresses no GPU of the source has; ``sxids``:
    (pci_bus_id, sxid, count), one per event; ``actions``: each GPU's XIDs seen since the exporter started."""

    node_xids: tuple[tuple[str, int, int], ...] = ()
    sxids: tuple[tuple[str, int, int], ...] = ()
    actions: tuple[XidAction, ...] = ()
