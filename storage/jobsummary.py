"""Job accounting: the summary of a job that has ended, computed once from the store and kept in ``job_summary``.

A summary holds GPU-hours (from the job's allocations), energy in kWh (each GPU's energy counter over the time it
held the GPU, summing its increases so that a counter reset loses nothing; mean power times the time held where a GPU
has no counter), mean utilization and peak memory (``storage.jobstats``), the share of the allocated GPU time left
idle (samples below ``Prices.idle_utilization``, a GPU allocated before its process started counting as idle), the
time a ``CommunicationStall`` alert about the job was firing (the alert history), and its cost and carbon at the
configured prices. Energy and idle share need the raw samples: a job summarised after their retention has neither.

``account_ended`` finds the jobs whose every allocation has closed and that have no summary yet, and stores theirs;
the collector calls it between rounds. ``summarise`` computes one job's summary on demand, ended or still running.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Final

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from gpulens.settings import Prices
from gpulens.storage import jobstats, schema
from gpulens.storage.db import Database
from gpulens.storage.records import JobAccount

STALL_RULE: Final = "CommunicationStall"  # the alert's contract name (gpulens.alerts.catalogue)
ENDED_AFTER_S: Final = 120.0  # a job counts as ended this long after its last allocation closed
LOOKBACK_S: Final = 7 * 86400.0  # account_ended looks at jobs that ended within this long
BATCH: Final = 20  # jobs summarised per call of account_ended
_ENERGY: Final = schema.FIELD_BY_NAME["energy_joules_total"]
_POWER: Final = schema.FIELD_BY_NAME["power_watts"]
_UTIL: Final = schema.FIELD_BY_NAME["utilization_ratio"]

job_summary: Final = sa.Table(
    "job_summary",
    schema.metadata,
    sa.Column("job_id", sa.Text, primary_key=True),
    sa.Column("user_name", sa.Text),
    sa.Column("start_ms", sa.BigInteger, nullable=False),
    sa.Column("end_ms", sa.BigInteger, nullable=False),
    sa.Column("computed_at", sa.Double, nullable=False),
    sa.Column("document", sa.JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),  # JobAccount
    sa.Index("ix_job_summary_end_ms", "end_ms"),
)


def _sample_sql(dialect: str) -> str:
    """Per allocation window: energy counter increases, its sample count, mean power, utilization and idle counts."""
    e, p, u = _ENERGY.column, _POWER.column, _UTIL.column
    return (
        f"SELECT sum(CASE WHEN d > 0 THEN d ELSE 0 END), count({e}), avg({p}), count({p}), count({u}), "  # noqa: S608
        f"sum(CASE WHEN {u} < :idle THEN 1 ELSE 0 END) FROM (SELECT {e}, {p}, {u}, "
        f"{e} - lag({e}) OVER (ORDER BY ts_ms) AS d FROM gpu_sample "
        "WHERE gpu_id = :gpu AND ts_ms >= :lo AND ts_ms <= :hi) AS w"
    )


def idle_below(prices: Prices) -> int:
    """The stored utilization value below which a sample counts as idle (``Prices.idle_utilization``)."""
    return round(prices.idle_utilization * _UTIL.per_unit / _UTIL.unit)


@dataclass(slots=True)
class _Usage:
    energy_j: float = 0.0
    counter: bool = False
    power: bool = False
    util_n: int = 0
    idle_n: int = 0


def summarise(db: Database, job_id: str, prices: Prices, *, now: float) -> JobAccount | None:
    """The job's summary over its whole life (to ``now`` while it runs); None for a job the store never saw."""
    a, g = schema.job_allocation, schema.gpu
    with db.session() as session:
        rows = session.execute(
            sa.select(a.c.gpu_id, a.c.start_ms, a.c.end_ms, a.c.user_name).where(a.c.job_id == job_id)
        ).all()
        if not rows:
            return None
        ended = all(r.end_ms is not None for r in rows)
        now_ms = round(now * 1000)
        windows = [(r.gpu_id, r.start_ms, r.end_ms if r.end_ms is not None else now_ms) for r in rows]
        usage = _Usage()
        idle = idle_below(prices)
        sql = sa.text(_sample_sql(db.dialect))
        for gpu_id, lo, hi in windows:
            rise, counter_n, power_mean, power_n, util_n, idle_n = session.execute(
                sql, {"gpu": gpu_id, "lo": lo, "hi": hi, "idle": idle}
            ).one()
            if counter_n and counter_n >= 2:
                usage.energy_j += _ENERGY.to_si(float(rise or 0))
                usage.counter = True
            elif power_n:
                usage.energy_j += _POWER.to_si(float(power_mean)) * (hi - lo) / 1000
                usage.power = True
            usage.util_n += int(util_n or 0)
            usage.idle_n += int(idle_n or 0)
        start_ms, end_ms = min(w[1] for w in windows), max(w[2] for w in windows)
        stall_s = _stall_seconds(session, job_id, start_ms / 1000, end_ms / 1000)
        nodes = session.execute(sa.select(g.c.node).where(g.c.id.in_({w[0] for w in windows})).distinct()).scalars()
        node_names = tuple(sorted(nodes))
    stats = jobstats.jobs(db, start_ms / 1000, end_ms / 1000, job_id=job_id)
    gpu_hours = sum((hi - lo) for _, lo, hi in windows) / schema.HOUR_MS
    kwh = usage.energy_j / 3.6e6 if usage.counter or usage.power else None
    source = "+".join(name for name, used in (("counter", usage.counter), ("power", usage.power)) if used) or None
    cost = gpu_hours * prices.per_gpu_hour + (kwh or 0.0) * prices.per_kwh
    return JobAccount(
        job_id=job_id,
        user=next((r.user_name for r in rows if r.user_name), None),
        start=start_ms / 1000,
        end=end_ms / 1000,
        ended=ended,
        gpus=len({w[0] for w in windows}),
        nodes=node_names,
        gpu_hours=gpu_hours,
        energy_kwh=kwh,
        energy_from=source,
        utilization_mean=stats[0].utilization_ratio_mean if stats else None,
        memory_peak_bytes=stats[0].memory_used_bytes_max if stats else None,
        idle_ratio=usage.idle_n / usage.util_n if usage.util_n else None,
        stall_seconds=stall_s,
        cost=cost,
        currency=prices.currency,
        carbon_gco2e=None if kwh is None else kwh * prices.carbon_gco2e_per_kwh,
    )


def _stall_seconds(session: Any, job_id: str, start: float, end: float) -> float:
    """Seconds within [start, end] during which a CommunicationStall alert naming the job was firing."""
    h = schema.alert_history
    rows = session.execute(
        sa.select(h.c.fingerprint, h.c.state, h.c.labels, h.c.at)
        .where(h.c.rule == STALL_RULE, h.c.at <= end)
        .order_by(h.c.fingerprint, h.c.at, h.c.id)
    ).all()
    spells: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for fingerprint, state, labels, at in rows:
        if job_id in str((labels or {}).get("job_id", "")).split(","):
            spells[fingerprint].append((float(at), state))
    total = 0.0
    for events in spells.values():
        since: float | None = None
        for at, state in events:
            if state == "firing" and since is None:
                since = at
            elif state != "firing" and since is not None:
                total += max(0.0, min(at, end) - max(since, start))
                since = None
        if since is not None:
            total += max(0.0, end - max(since, start))
    return total


def store(db: Database, account: JobAccount, *, now: float) -> None:
    """Keep ``account`` as the job's summary (replacing one stored before)."""
    values = {
        "user_name": account.user,
        "start_ms": round(account.start * 1000),
        "end_ms": round(account.end * 1000),
        "computed_at": now,
        "document": account.to_json(),
    }
    with db.write_transaction() as conn:
        updated = conn.execute(sa.update(job_summary).where(job_summary.c.job_id == account.job_id).values(**values))
        if updated.rowcount == 0:
            conn.execute(sa.insert(job_summary).values(job_id=account.job_id, **values))


def stored(db: Database, job_id: str) -> JobAccount | None:
    """The summary stored when the job ended, if any."""
    with db.session() as session:
        doc = session.execute(sa.select(job_summary.c.document).where(job_summary.c.job_id == job_id)).scalar()
    return None if doc is None else JobAccount.from_json(dict(doc))


def account_ended(db: Database, prices: Prices, *, now: float, limit: int = BATCH) -> list[str]:
    """Summarise and store up to ``limit`` jobs that ended (every allocation closed ``ENDED_AFTER_S`` ago, within
    ``LOOKBACK_S``) and have no summary yet; the job ids summarised."""
    a = schema.job_allocation
    cut_ms, since_ms = round((now - ENDED_AFTER_S) * 1000), round((now - LOOKBACK_S) * 1000)
    with db.session() as session:
        ended = (
            session.execute(
                sa.select(a.c.job_id)
                .where(a.c.job_id.not_in(sa.select(job_summary.c.job_id)))
                .group_by(a.c.job_id)
                .having(sa.func.count() == sa.func.count(a.c.end_ms))
                .having(sa.func.max(a.c.end_ms) < cut_ms, sa.func.max(a.c.end_ms) >= since_ms)
                .order_by(sa.func.max(a.c.end_ms))
                .limit(limit)
            )
            .scalars()
            .all()
        )
    done = []
    for job_id in ended:
        account = summarise(db, job_id, prices, now=now)
        if account is not None:
            store(db, account, now=now)
            done.append(job_id)
    return done


def has_table(db: Database) -> bool:
    """Whether the store keeps summaries (revision 0015 or later)."""
    with db.session() as session:
        return sa.inspect(session.connection()).has_table("job_summary")
