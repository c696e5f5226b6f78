"""The node's hardware against what it should be in the store: one row per node, its newest ``NodeHardware``.

``node_hardware`` keeps, per node, the last hardware document its agent sent (``gpulens.nodehardware``, as JSON) and
the driver version, with the time of the round that wrote it. The hardware changes rarely, so the writer writes a
node's row only when its document or driver version changes: a store of 1,000 nodes writes nothing in most rounds.
A round read back from the store (``alerts.storeround``, the rules over a shared store) gives each node its row, so
that ``GpuMissing``, ``IbPortMissing``, ``GpuFabricNotReady`` and ``GpuConfigDrift`` judge it as the collector's own
engine does. The row of a node that stopped sending hardware stays, and is given only to a node with fresh GPU
readings.

The document also carries the node's health (``HEALTH_KEY``: ``gpulens.nodehealth.node_health`` of the snapshot that
wrote it, state, findings and action), so that the dashboard colours nodes by health without a table of its own;
a change of health rewrites the row like a change of hardware.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final

import msgspec
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from gpulens.logutil import LogOnce
from gpulens.model import NodeSnapshot
from gpulens.nodehardware import NodeHardware
from gpulens.nodehealth import NodeHealth, node_health
from gpulens.storage import schema
from gpulens.storage.db import Database

HEALTH_KEY: Final = "health"  # the node's health (``NodeHealth.to_json``) in the row's document, beside its hardware
log = logging.getLogger(__name__)
_bad_rows: Final = LogOnce(log)

node_hardware: Final = sa.Table(
    "node_hardware",
    schema.metadata,
    sa.Column("node", sa.String(255), primary_key=True),
    sa.Column("ts_ms", sa.BigInteger, nullable=False),
    sa.Column("driver_version", sa.String(64), nullable=True),
    sa.Column("document", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),  # NodeHardware
)


class HardwareWriter:
    """Writes each node's hardware when it changes; remembers what it wrote until ``reset``."""

    def __init__(self) -> None:
        self._written: dict[str, tuple[str | None, NodeHardware, dict[str, object]]] = {}

    def reset(self) -> None:
        self._written.clear()

    def write(self, conn: Connection, snapshots: Sequence[NodeSnapshot]) -> int:
        """The changed rows of a round, in the writer's transaction; returns how many were written."""
        rows: list[dict[str, Any]] = []
        changed: dict[str, tuple[str | None, NodeHardware, dict[str, object]]] = {}
        for snap in snapshots:
            if snap.hardware is None:
                continue
            health = node_health(snap).to_json()
            now = (snap.driver_version, snap.hardware, health)
            if self._written.get(snap.node) == now or changed.get(snap.node) == now:
                continue
            changed[snap.node] = now
            rows = [r for r in rows if r["node"] != snap.node]  # a node twice in a round: the later wins
            rows.append(
                {
                    "node": snap.node,
                    "ts_ms": round(snap.timestamp * 1000),
                    "driver_version": snap.driver_version,
                    "document": {**msgspec.to_builtins(snap.hardware), HEALTH_KEY: health},
                }
            )
        if rows:
            conn.execute(sa.delete(node_hardware).where(node_hardware.c.node.in_([r["node"] for r in rows])))
            conn.execute(sa.insert(node_hardware), rows)
            self._written.update(changed)
        return len(rows)


def latest_health(db: Database, nodes: Sequence[str] | None = None) -> dict[str, NodeHealth]:
    """Each node's health as it was judged when its row was written (``gpulens.nodehealth``), where the row holds
    one; a row that does not parse is left out and counted in the log once."""
    t = node_hardware
    query = sa.select(t.c.node, t.c.document)
    if nodes is not None:
        query = query.where(t.c.node.in_(list(nodes)))
    with db.session() as session:
        found = session.execute(query).all()
    out: dict[str, NodeHealth] = {}
    for node, doc in found:
        if isinstance(doc, dict) and HEALTH_KEY in doc:
            try:
                out[node] = NodeHealth.from_json(doc[HEALTH_KEY])
            except ValueError as exc:
                _bad_rows(f"health:{node}", "node %s: its stored health is unreadable: %s", node, exc)
    return out


def latest(db: Database, nodes: Sequence[str] | None = None) -> dict[str, tuple[NodeHardware, str | None]]:
    """Each node's stored hardware and driver version (of ``nodes`` only, if given)."""
    t = node_hardware
    query = sa.select(t.c.node, t.c.driver_version, t.c.document)
    if nodes is not None:
        query = query.where(t.c.node.in_(list(nodes)))
    with db.session() as session:
        found = session.execute(query).all()
    return {node: (msgspec.convert(doc, NodeHardware), driver) for node, driver, doc in found}
