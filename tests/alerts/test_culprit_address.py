"""An incident's GPU culprit gets its PCI address from what is known of that GPU: the engine's history, else the store
(SQL here; Prometheus in ``tests/storage/test_prometheus.py``), asked once per GPU; a store that cannot answer leaves
the address unknown and the round whole."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from gpulens.alerts.culpritaddress import CulpritAddresses, from_store
from gpulens.alerts.history import History
from gpulens.alerts.incidents import form
from gpulens.alerts.state import FIRING, AlertState, fingerprint
from gpulens.storage.connect import open_database
from gpulens.storage.reading import DatabaseUnavailableError
from gpulens.storage.sqlreader import SqlReader
from gpulens.storage.writer import Writer
from tests.fakes.static_source import node_snapshot

T0 = 1_700_000_000.0


def lost(node: str, gpu: int, uuid: str) -> dict[str, AlertState]:
    labels = {"alertname": "GpuLost", "severity": "critical", "node": node, "gpu": str(gpu), "uuid": uuid}
    a = AlertState(fingerprint(labels), "GpuLost", labels, {}, FIRING, T0, fired_at=T0, last_seen=T0)
    return {a.fingerprint: a}


def test_the_pci_address_comes_from_the_history_then_the_store_asked_once(tmp_path: Path) -> None:
    snap = node_snapshot("node-03", gpus=4, t=T0)
    target = snap.gpus[2]
    assert target.pci_bus_id
    # the history: the GPU's reading with its address
    history = History()
    history.add(T0, [snap])
    (inc,) = CulpritAddresses().fill(form({}, lost("node-03", 2, target.uuid), T0), history).values()
    assert inc.culprit.pci == target.pci_bus_id
    assert inc.to_json()["culprit"]["pci"] == target.pci_bus_id  # what the store and the notifications carry
    # a history without the address (a round over Prometheus reads few fields of most GPUs): the SQL store's
    db = open_database(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        Writer(db).write([snap])
        bare = History()
        bare.add(T0, [replace(snap, gpus=tuple(replace(g, pci_bus_id=None) for g in snap.gpus))])
        store = from_store(SqlReader(db))
        asked: list[Sequence[str]] = []

        def counted(uuids: Sequence[str]) -> Mapping[str, str]:
            asked.append(uuids)
            return store(uuids)

        addresses = CulpritAddresses(counted)
        for k in range(3):
            (inc,) = addresses.fill(form({}, lost("node-03", 2, target.uuid), T0 + k), bare).values()
            assert inc.culprit.pci == target.pci_bus_id
        assert asked == [[target.uuid]]  # once for the GPU, not every round
        # named by node and index alone: the history gives its UUID
        labels = lost("node-03", 1, "")
        (inc,) = CulpritAddresses(store).fill(form({}, labels, T0), bare).values()
        assert inc.culprit.pci == snap.gpus[1].pci_bus_id
    finally:
        db.close()


def test_a_store_that_cannot_answer_leaves_the_address_unknown(caplog: pytest.LogCaptureFixture) -> None:
    def down(uuids: Sequence[str]) -> Mapping[str, str]:
        raise DatabaseUnavailableError("connection refused")

    addresses = CulpritAddresses(down)
    with caplog.at_level(logging.WARNING, logger="gpulens.alerts.culpritaddress"):
        for k in range(3):
            (inc,) = addresses.fill(form({}, lost("node-09", 0, "GPU-x"), T0 + k), History()).values()
            assert inc.culprit.pci is None
    assert addresses.failures == 3
    assert len(caplog.records) == 1  # logged once
    assert "connection refused" in caplog.records[0].getMessage()
