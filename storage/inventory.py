"""What the store knows besides samples: static info of every GPU, NVLink outages, the collector's target health."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from gpulens.model import TargetHealth
from gpulens.storage import schema
from gpulens.storage.db import Database
from gpulens.storage.records import GpuInfo, LinkOutage


def target_health(db: Database) -> list[TargetHealth]:
    """The latest health of every target, by name."""
    t = schema.target_health
    with db.session() as session:
        rows = session.execute(sa.select(t).order_by(t.c.target)).all()
    return [
        TargetHealth(
            target=row.target,
            url=row.url,
            kind=row.kind,
            timestamp=row.at,
            up=bool(row.up),
            node=row.node,
            scrape_duration_seconds=row.scrape_duration_seconds,
            samples=row.samples,
            rejected=row.rejected,
            last_error=row.last_error,
        )
        for row in rows
    ]


def gpu_info(db: Database, *, uuids: Sequence[str] | None = None) -> list[GpuInfo]:
    """Static info of every GPU ever stored (until retention removes it; of ``uuids`` only, if given), by node and
    index."""
    g = schema.gpu
    query = sa.select(g).order_by(g.c.node, g.c.gpu_index)
    if uuids is not None:
        query = query.where(g.c.uuid.in_(list(uuids)))
    with db.session() as session:
        rows = session.execute(query).all()
    return [
        GpuInfo(
            node=row.node,
            gpu=row.gpu_index,
            uuid=row.uuid,
            model=row.model,
            pci_bus_id=row.pci_bus_id,
            driver_version=row.driver_version,
            mig_enabled=row.mig_enabled,
            first_seen=row.first_seen_ms / 1000,
            last_seen=row.last_seen_ms / 1000,
        )
        for row in rows
    ]


def link_outages(db: Database, start: float, end: float) -> list[LinkOutage]:
    """NVLinks reported inactive at some time in [start, end]."""
    n, g = schema.nvlink_down, schema.gpu
    start_ms, end_ms = round(start * 1000), round(end * 1000)
    with db.session() as session:
        rows = session.execute(
            sa.select(g.c.node, g.c.gpu_index, g.c.uuid, n.c.link, n.c.start_ms, n.c.end_ms, n.c.remote_pci_bus_id)
            .join(n, n.c.gpu_id == g.c.id)
            .where(n.c.start_ms <= end_ms, sa.or_(n.c.end_ms.is_(None), n.c.end_ms >= start_ms))
            .order_by(g.c.node, g.c.gpu_index, n.c.link, n.c.start_ms)
        ).all()
    return [
        LinkOutage(
            node=row.node,
            gpu=row.gpu_index,
            uuid=row.uuid,
            link=row.link,
            since=row.start_ms / 1000,
            until=None if row.end_ms is None else row.end_ms / 1000,
            remote_pci_bus_id=row.remote_pci_bus_id,
        )
        for row in rows
    ]


def history_start(db: Database) -> float | None:
    """When the stored history begins: the first GPU's ``first_seen_ms`` (one row of the small GPU table); None for
    an empty store."""
    with db.session() as s:
        first = s.execute(sa.select(sa.func.min(schema.gpu.c.first_seen_ms))).scalar()
    return None if first is None else first / 1000.0
