"""The PCI address of an incident's GPU culprit, from what is known of that GPU when the incident is built.

An alert names its GPU by node, index and UUID; only ``GpuMissing`` carries a PCI address. ``CulpritAddresses.fill``
gives each GPU culprit without one the PCI bus id of its GPU: from the engine's history first (the GPU's newest
reading that has one; a lost GPU's reading keeps its identity), else from the store the rules read (``gpu_info``:
the SQL inventory, or Prometheus's ``gpulens_gpu_info``). What it finds is remembered per UUID, so a store is asked
once per GPU; a store that cannot answer leaves the address unknown (logged once), never the round failed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Final

from gpulens.alerts.history import History
from gpulens.alerts.incidents import Incident
from gpulens.storage.reading import DatabaseUnavailableError, NotAvailableOnBackend, StoreReader

log = logging.getLogger(__name__)

# UUIDs -> the PCI bus id of each the store knows.
Lookup = Callable[[Sequence[str]], Mapping[str, str]]
KNOWN_MAX: Final = 100_000  # addresses remembered, at most (one per GPU of a large cluster)


def from_store(store: StoreReader) -> Lookup:
    """A lookup over ``store.gpu_info`` (SQL or Prometheus)."""

    def lookup(uuids: Sequence[str]) -> Mapping[str, str]:
        return {g.uuid: g.pci_bus_id for g in store.gpu_info(uuids=uuids) if g.pci_bus_id}

    return lookup


def _from_history(history: History, uuid: str) -> str | None:
    for _, reading in reversed(history.series(uuid)):
        if reading.pci_bus_id:
            return reading.pci_bus_id
    return None


class CulpritAddresses:
    """Fills the ``pci`` of GPU culprits (see the module's docstring); ``store`` is asked for what the history
    lacks."""

    def __init__(self, store: Lookup | None = None) -> None:
        self._store = store
        self._known: dict[str, str] = {}
        self._asked: set[str] = set()  # UUIDs the store was asked for (an unknown one is not asked again)
        self.failures = 0

    def fill(self, incidents: Mapping[str, Incident], history: History) -> dict[str, Incident]:
        wanted = {i.id: i for i in incidents.values() if i.culprit.kind == "gpu" and not i.culprit.pci}
        if not wanted:
            return dict(incidents)
        latest = history.latest
        by_place = {(r.node, r.gpu): uuid for uuid, r in latest.gpus.items()} if latest is not None else {}
        uuids: dict[str, str] = {}  # incident id -> its GPU's UUID
        for inc in wanted.values():
            c = inc.culprit
            uuid = c.uuid or by_place.get((c.node or "", c.gpu if c.gpu is not None else -1))
            if uuid is None:
                continue
            uuids[inc.id] = uuid
            if uuid not in self._known and (address := _from_history(history, uuid)) is not None:
                self._remember(uuid, address)
        self._ask_store(sorted({u for u in uuids.values() if u not in self._known and u not in self._asked}))
        out = dict(incidents)
        for incident_id, uuid in uuids.items():
            address = self._known.get(uuid)
            if address is not None:
                inc = out[incident_id]
                out[incident_id] = replace(inc, culprit=replace(inc.culprit, pci=address))
        return out

    def _remember(self, uuid: str, address: str) -> None:
        if len(self._known) >= KNOWN_MAX:
            self._known.clear()
        self._known[uuid] = address

    def _ask_store(self, uuids: Sequence[str]) -> None:
        if self._store is None or not uuids:
            return
        try:
            found = self._store(uuids)
        except (DatabaseUnavailableError, NotAvailableOnBackend, ValueError, OSError) as exc:
            self.failures += 1
            if self.failures == 1:
                log.warning("the PCI address of an incident's GPU is unknown: the store did not answer (%s)", exc)
            return
        if len(self._asked) >= KNOWN_MAX:
            self._asked.clear()
        self._asked.update(uuids)
        for uuid, address in found.items():
            self._remember(uuid, address)
