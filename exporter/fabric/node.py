"""The fabric and host in the node snapshot: one collection's RDMA ports (with their GPUs), host and jobs' cgroups.

``FabricReader.enrich`` runs after the GPU source and the job mapping, in the same collection: it reads every RDMA
port (``ibports``), gives each its nearest GPUs from the PCI addresses of the snapshot's GPUs (``affinity``), reads
the node's CPUs and memory and, for the jobs of the snapshot's GPU processes, their cgroups (``host``), and returns
the snapshot with ``nics``, ``host`` and ``job_hosts`` filled in and the readers' cumulative failure counts added to
``errors``. It never raises: an unexpected failure leaves the snapshot's GPU part as it was and is counted under
``fabric_failed`` (logged once).

Roots: ``sysfs_root`` is where ``sys/`` hangs (``/`` on a host, ``/host`` with the host's root mounted there); the
cgroup hierarchy is ``<sysfs_root>/sys/fs/cgroup``; ``proc_root`` is the host's ``/proc``. See docs/fabric.md.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from gpulens.clock import Clock
from gpulens.exporter.fabric.affinity import PciTopology
from gpulens.exporter.fabric.host import HostReader, JobHostReader
from gpulens.exporter.fabric.ibports import IbPortReader
from gpulens.exporter.fabric.sysread import AttributeReader
from gpulens.fabricmodel import NicReading
from gpulens.logutil import ErrorCounter
from gpulens.model import NodeSnapshot

logger = logging.getLogger(__name__)

FABRIC_FAILED = "fabric_failed"


class FabricReader:
    """Adds the node's RDMA ports, host and per-job cgroup readings to each snapshot; see the module docstring."""

    def __init__(
        self,
        node: str,
        *,
        sysfs_root: str = "/",
        proc_root: str = "/proc",
        cgroup_root: str | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._errors = ErrorCounter(logger)
        self._ports = IbPortReader(node, root=sysfs_root, clock=clock)
        self._topology = PciTopology(root=sysfs_root)
        host = AttributeReader("host", ErrorCounter(logger))  # node and job reads share the host_* counts
        self._host = HostReader(node, proc_root=proc_root, reader=host)
        cgroups = cgroup_root if cgroup_root is not None else os.path.join(sysfs_root, "sys", "fs", "cgroup")
        self._jobs = JobHostReader(node, proc_root=proc_root, cgroup_root=cgroups, reader=host, clock=clock)

    @property
    def errors(self) -> Mapping[str, int]:
        """Cumulative failure counts of every reader by reason (``ib_*``, ``affinity_*``, ``host_*``, ``fabric_*``)."""
        out = dict(self._errors.snapshot())
        for counts in (self._ports.errors, self._topology.errors, self._host.errors):
            for reason, count in counts.items():
                out[reason] = out.get(reason, 0) + count
        return out

    def read(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        """The snapshot with ``nics``, ``host`` and ``job_hosts`` read now; raises whatever a reader raises."""
        # Readings carry the snapshot's node name, which a dcgm-exporter page may set.
        self._ports.node = self._host.node = self._jobs.node = snapshot.node
        nics: tuple[NicReading, ...] = self._ports.read()
        gpu_bus_ids = {g.gpu: g.pci_bus_id for g in snapshot.gpus if g.pci_bus_id}
        if nics and gpu_bus_ids:
            nics = self._topology.assign(nics, gpu_bus_ids)
        host = self._host.read()
        job_hosts = self._jobs.read(sorted({p.pid for p in snapshot.processes}))
        return snapshot.replace(nics=nics, host=host, job_hosts=job_hosts)

    def enrich(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        """:meth:`read`, never raising; the readers' failure counts are added to ``snapshot.errors``."""
        try:
            enriched = self.read(snapshot)
        except Exception as exc:  # noqa: BLE001 - the fabric must never cost the node its GPU readings
            self._errors.count(
                FABRIC_FAILED, "reading the fabric and host failed: %s (further failures are counted)", exc
            )
            enriched = snapshot
        errors = dict(snapshot.errors)
        for reason, count in self.errors.items():
            errors[reason] = errors.get(reason, 0) + count
        return enriched.replace(errors=errors)
