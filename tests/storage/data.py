"""Snapshot builders for the storage tests, on top of the exporter tests' fixed H100 readings."""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic.script import ScriptDirectory

from gpulens.model import GpuJob, LinkReading, NodeSnapshot, ProcessReading
from gpulens.storage import partitions, schema
from gpulens.storage.db import MIGRATIONS_DIR, Database
from gpulens.storage.migrations.fields import fields_at
from tests.fakes.static_source import GIB, h100


def snapshot(
    node: str,
    t: float,
    *,
    gpus: int = 2,
    job: str | None = None,
    user: str = "alice",
    down_links: tuple[int, ...] | None = None,
    **changes: object,
) -> NodeSnapshot:
    """``gpus`` H100 readings at ``t`` (each with ``changes``), optionally held by ``job`` and with NVLink states."""
    readings = tuple(h100(node, i, t, **changes) for i in range(gpus))
    jobs = tuple(GpuJob(node, g.gpu, g.uuid, job, user) for g in readings) if job else ()
    processes = (
        tuple(ProcessReading(node, g.gpu, g.uuid, 4000 + g.gpu, 10 * GIB, "python", user, job) for g in readings)
        if job
        else ()
    )
    links = (
        tuple(
            LinkReading(node, g.gpu, g.uuid, link, link not in down_links, remote_pci_bus_id=f"remote-{link}")
            for g in readings
            for link in range(4)
        )
        if down_links is not None
        else ()
    )
    return NodeSnapshot(
        node=node, timestamp=t, source="test", gpus=readings, jobs=jobs, processes=processes, links=links
    )


def uuid_of(node: str, index: int) -> str:
    return h100(node, index, 0.0).uuid


def write_wide(db: Database, snapshots: Sequence[NodeSnapshot]) -> None:
    """Store the snapshots' GPU readings as the writer did before revision 0008 (every field in the sample row, no
    ``gpu_profile``): for stores held at an older revision. GPU rows and samples only; values encoded alike."""
    with db.engine.connect() as conn:  # the store's revision may predate some fields (0012's, say)
        present = {c["name"] for c in sa.inspect(conn).get_columns("gpu_sample")}
    fields = [f for f in schema.SAMPLE_FIELDS[:-1] if f.column in present]  # xid_total (the last): from xid_errors
    pg = db.dialect == "postgresql"

    def param(i: int, f: schema.StoredField) -> str:
        return f"CAST(:p{i} AS {f.pg_param_type})" if pg else f":p{i}"

    columns = ", ".join([*(f.column for f in fields), "gpu_id", "ts_ms", "xid_total", "xid_errors"])
    values = ", ".join([*(f.sql_encode(param(i, f), db.dialect) for i, f in enumerate(fields)), ":g, :t, :x, :e"])
    insert = sa.text(f"INSERT INTO gpu_sample ({columns}) VALUES ({values})")
    with db.write_transaction() as conn:
        for s in snapshots:
            for r in s.gpus:
                ts = round(r.timestamp * 1000)
                if pg:
                    partitions.create_partition(conn, "gpu_sample", partitions.partition_start("gpu_sample", ts))
                gpu_id = conn.execute(sa.text("SELECT id FROM gpu WHERE uuid = :u"), {"u": r.uuid}).scalar()
                if gpu_id is None:
                    gpu = {"u": r.uuid, "n": r.node, "i": r.gpu, "m": r.model, "p": r.pci_bus_id, "t": ts}
                    gpu_id = conn.execute(
                        sa.text(
                            "INSERT INTO gpu (uuid, node, gpu_index, model, pci_bus_id, first_seen_ms, last_seen_ms) "
                            "VALUES (:u, :n, :i, :m, :p, :t, :t) RETURNING id"
                        ),
                        gpu,
                    ).scalar_one()
                seen = sa.text("UPDATE gpu SET last_seen_ms = :t WHERE id = :g AND last_seen_ms < :t")
                conn.execute(seen, {"g": gpu_id, "t": ts})
                xids = r.xid_errors
                text = json.dumps({str(k): xids[k] for k in sorted(xids)}, separators=(",", ":")) if xids else None
                params = {f"p{i}": getattr(r, f.name) for i, f in enumerate(fields)}
                conn.execute(insert, {**params, "g": gpu_id, "t": ts, "x": sum(xids.values()), "e": text})


def downgrade(db: Database, revision: str) -> None:
    """Take the store down to ``revision``, as ``gpulens db downgrade --to`` does."""
    db.downgrade(revision)


def columns_added_after(revision: str) -> frozenset[str]:
    """The sample columns later revisions added: a downgrade below them drops their values, by design."""
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    before = {f.column for f in fields_at(revision, script)}
    added = [f for f in fields_at(Database.head_revision(), script) if f.column not in before]
    return frozenset([f.column for f in added] + [f.name for f in added])  # stored columns, and the views' names
