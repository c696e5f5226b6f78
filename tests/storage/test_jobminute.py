"""The per-job minute aggregate (``storage.jobminute``) on SQLite and PostgreSQL: the same figures as the computation
from the samples it replaces, jobs on several nodes, rounds written again or late, retention, and the upgrade of a
store with data to revision 0009."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import sqlalchemy as sa

from gpulens.storage import jobminute, jobstats, schema, tiers
from gpulens.storage.db import Database
from gpulens.storage.records import JobSummary
from gpulens.storage.retention import Retention, RetentionJob, apply_retention
from gpulens.storage.rollup import Rollups
from gpulens.storage.writer import Writer
from tests.fakes.static_source import GIB
from tests.storage.conftest import T0
from tests.storage.data import downgrade, snapshot

M0 = (T0 - T0 % 60) + 60  # a minute boundary, in seconds
_ORDER = ("ts_ms", "job_id", *jobminute.COLUMNS)


def stored(db: Database) -> list[tuple[Any, ...]]:
    m = jobminute.job_minute
    with db.session() as session:
        rows = session.execute(sa.select(*(m.c[c] for c in _ORDER)).order_by(m.c.ts_ms, m.c.job_id)).all()
    return [tuple(row) for row in rows]


def from_samples(db: Database) -> list[tuple[Any, ...]]:
    """The aggregate computed afresh from every raw sample and the job allocations."""
    source = "SELECT DISTINCT (ts_ms / 60000) * 60000 AS m FROM gpu_sample"
    with db.session() as session:
        rows = session.execute(sa.text(jobminute.from_samples_sql(db.dialect, source))).all()
    return sorted(tuple(row) for row in rows)


def old_way(db: Database, start: float, end: float, job_id: str | None = None) -> list[JobSummary]:
    """``jobstats.jobs`` as it read before the aggregate: its horizon moved past the range, so every minute is read
    from the samples and rollups per GPU."""
    t = schema.tier_state
    with db.write_transaction() as conn:
        (before,) = conn.execute(sa.select(t.c.horizon_ms).where(t.c.tier == jobminute.TIER)).one()
        conn.execute(sa.update(t).where(t.c.tier == jobminute.TIER).values(horizon_ms=round(end * 1000) + 60_000))
    try:
        return jobstats.jobs(db, start, end, job_id=job_id)
    finally:
        with db.write_transaction() as conn:
            conn.execute(sa.update(t).where(t.c.tier == jobminute.TIER).values(horizon_ms=before))


def rows_keys(rows: list[tuple[Any, ...]], job_id: str) -> set[tuple[Any, ...]]:
    return {row[:2] for row in rows if row[1] == job_id}


def assert_same(new: list[JobSummary], old: list[JobSummary], *, rel: float = 1e-9) -> None:
    assert [j.job_id for j in new] == [j.job_id for j in old]
    for a, b in zip(new, old, strict=True):
        for f in dataclasses.fields(JobSummary):
            x, y = getattr(a, f.name), getattr(b, f.name)
            if f.name == "resolution":
                continue
            if isinstance(x, float) and isinstance(y, float):
                assert math.isclose(x, y, rel_tol=rel, abs_tol=1e-9), (a.job_id, f.name, x, y)
            else:
                assert x == y, (a.job_id, f.name, x, y)


def varied(node: str, t: float, k: int, job: str | None, gpus: int = 2) -> Any:
    snap = snapshot(node, t, gpus=gpus, job=job)
    readings = tuple(
        dataclasses.replace(
            r,
            utilization_ratio=None if (k + i) % 7 == 3 else ((k * 37 + i * 11) % 100) / 100,
            memory_used_bytes=None if (k + i) % 11 == 5 else ((k + i) % 13 + 1) * GIB,
        )
        for i, r in enumerate(snap.gpus)
    )
    return snap.replace(gpus=readings)


def write_cluster(db: Database) -> None:
    """Rounds 10 s apart for 20 minutes: job "wide" on nodes a and b throughout, job "short" on c for minutes 3-9
    (starting and ending mid-minute), node d idle; GPU values vary, some unknown."""
    writer = Writer(db)
    for k in range(120):
        t = M0 + 10 * k + 3
        short = "short" if 21 <= k < 57 else None
        writer.write(
            [
                varied("a", t, k, "wide"),
                varied("b", t, k, "wide"),
                varied("c", t, k, short),
                varied("d", t, k, None),
            ]
        )


def test_the_aggregate_gives_what_the_samples_give(db: Database) -> None:
    write_cluster(db)
    assert stored(db) == from_samples(db)
    end = M0 + 20 * 60 - 0.001  # minute-aligned ranges: the aggregate's minutes are the samples' own
    new = jobstats.jobs(db, M0, end)
    assert [j.job_id for j in new] == ["wide", "short"]
    assert_same(new, old_way(db, M0, end))
    assert_same(jobstats.jobs(db, M0 + 300, M0 + 600 - 0.001), old_way(db, M0 + 300, M0 + 600 - 0.001))
    assert_same(jobstats.jobs(db, M0, end, job_id="short"), old_way(db, M0, end, job_id="short"))
    assert new[0].resolution == "1m"


def test_a_job_on_two_nodes_sums_the_gpus_of_both(db: Database) -> None:
    writer = Writer(db)
    for k in range(6):  # one minute, a reading every 10 s
        t = M0 + 10 * k
        a = snapshot("a", t, gpus=2, job="wide", utilization_ratio=0.2, memory_used_bytes=10 * GIB)
        b = snapshot("b", t, gpus=4, job="wide", utilization_ratio=0.8, memory_used_bytes=30 * GIB)
        writer.write([a, b])
    [(ts_ms, job_id, util_n, util_sum, util_sq, memory_n, memory_sum, memory_max)] = stored(db)
    assert (ts_ms, job_id) == (round(M0 * 1000), "wide")
    assert (util_n, memory_n) == (6 * 6, 6 * 6)
    assert util_sum == 6 * (2 * 2000 + 4 * 8000)
    assert util_sq == 6 * (2 * 2000**2 + 4 * 8000**2)
    assert memory_sum == 6 * (2 * 10 + 4 * 30) * 1024 * 1024  # KiB
    assert memory_max == 30 * 1024 * 1024
    [job] = jobstats.jobs(db, M0, M0 + 59)
    assert job.nodes == ("a", "b")
    assert job.utilization_ratio_mean == pytest.approx((2 * 0.2 + 4 * 0.8) / 6)
    assert job.memory_used_bytes_max == 30 * GIB


def test_rounds_written_again_or_late_count_once(db: Database) -> None:
    rounds = [[varied("a", M0 + 10 * k, k, "j"), varied("b", M0 + 10 * k, k, "j")] for k in range(18)]
    writer = Writer(db)
    for k in (0, 1, 2, 4, 5, 7, 8, 9, 10, 11, 12, 13, 15, 16, 17):  # 3, 6 and 14 come late
        writer.write(rounds[k])
    once = stored(db)
    assert writer.write(rounds[17]).job_minute_rows == 0  # the newest again (a stale exporter): nothing recomputed
    assert Writer(db).write(rounds[17]).job_minute_rows == 0
    writer.write(rounds[9])  # written again by the same writer
    Writer(db).write(rounds[10] + rounds[11])  # and by a fresh one (state loaded from the store)
    assert stored(db) == once
    writer.write(rounds[3])  # late, out of order
    Writer(db).write(rounds[14] + rounds[6])
    in_order = stored(db)
    assert in_order == from_samples(db)
    known = [r for snaps in rounds for snap in snaps for r in snap.gpus if r.utilization_ratio is not None]
    assert sum(row[2] for row in in_order) == len(known) > 18 * 3  # every sample of the 2 x 2 GPUs once
    assert sum(row[2] for row in in_order) > sum(row[2] for row in once)


def test_duplicates_within_a_round_count_once(db: Database) -> None:
    first = varied("a", M0, 0, "j")
    again = varied("a", M0, 1, "j")  # the same GPUs and time, other values: the later one is stored
    Writer(db).write([first, again])
    assert stored(db) == from_samples(db)
    assert stored(db)[0][2] == 2


def test_retention_trims_the_aggregate_and_reads_before_it_use_the_rollups(db: Database) -> None:
    write_cluster(db)
    Rollups(db, settle_s=0).run(M0 + 3600)
    before = jobstats.jobs(db, M0, M0 + 20 * 60 - 0.001)
    keep = Retention(raw_s=86_400, minute_s=M0 + 3600 - (M0 + 600), hour_s=86_400)  # 1m cutoff at minute 10
    removed = apply_retention(db, M0 + 3600, keep)
    assert removed["job_minute.rows"] > 0
    assert min(row[0] for row in stored(db)) == round((M0 + 600) * 1000)
    horizon = tiers.tier_state
    with db.session() as session:
        assert horizon(session)[jobminute.TIER][1] == round((M0 + 600) * 1000)
    after = jobstats.jobs(db, M0, M0 + 20 * 60 - 0.001)  # the first 10 minutes from the 1-hour rollups now
    assert [j.job_id for j in after] == [j.job_id for j in before]
    assert after[0].gpu_hours == before[0].gpu_hours
    assert after[0].utilization_ratio_mean == pytest.approx(before[0].utilization_ratio_mean, rel=0.05)


def test_the_retention_job_trims_the_aggregate_in_steps(db: Database) -> None:
    write_cluster(db)
    cutoff_ms = round((M0 + 900) * 1000)
    expected = sum(1 for row in stored(db) if row[0] < cutoff_ms)
    job = RetentionJob(db, Retention(raw_s=86_400, minute_s=3600 - 900, hour_s=86_400))  # cutoff at minute 15
    job._slice["job_minute"] = 2  # two minutes a step at first, so that the piece takes several steps
    steps = 1
    while job.step(M0 + 3600, max_seconds=1e-9):  # each step as short as can be: the slice does not grow
        steps += 1
    assert job.removed["job_minute.rows"] == expected > 0
    assert steps >= 15 // 2
    assert min(row[0] for row in stored(db)) == cutoff_ms


@pytest.mark.empty_store
def test_the_upgrade_fills_the_aggregate_of_a_store_with_data(db_url: str) -> None:
    """A store at 0008 (no aggregate), partly rolled up: after 0009 the minutes below the rollup position come from
    the rollups, the rest from the samples, and the jobs read the same as before the upgrade.

    The store is written at the head and taken down to 0008 (today's code reads SQLite's samples by their stored
    minute, revision 0010); the jobs before the upgrade are read without the aggregate, as 0008 read them."""
    db = Database(db_url)
    try:
        db.upgrade()
        write_cluster(db)
        Rollups(db, settle_s=0).run(M0 + 10 * 60)  # rolled up to minute 10 (settle 0: minutes 0-9 complete)
        end = M0 + 20 * 60 - 0.001
        with db.write_transaction() as conn:  # no horizon: jobstats reads the rollups and samples alone
            conn.execute(sa.delete(schema.tier_state).where(schema.tier_state.c.tier == jobminute.TIER))
        before = jobstats.jobs(db, M0, end)
        downgrade(db, "0008")
        with db.session() as session:
            assert not sa.inspect(session.connection()).has_table("job_minute")
        db.upgrade()
        samples = {row[:2]: row for row in from_samples(db)}
        position = round((M0 + 10 * 60) * 1000)
        rows = stored(db)
        # Below the position, a bucket counts for the jobs whose allocation covers its start, as jobstats read the
        # rollups before: not the minute a job started in (mid-minute here), all of the minute it ended in.
        first = {(round(M0 * 1000), "wide"), (round((M0 + 180) * 1000), "short")}
        assert {row[:2] for row in rows} == set(samples) - first
        assert [row for row in rows if row[0] >= position] == [
            v for k, v in sorted(samples.items()) if k[0] >= position
        ]
        # From the rollups, as jobstats weighed them: each bucket mean by its sample count, even where some of its
        # samples had no value; the maxima are the samples' own.
        assert [row[7] for row in rows if row[1] == "wide"] == [
            v[7] for k, v in sorted(samples.items()) if k in rows_keys(rows, "wide")
        ]
        after = jobstats.jobs(db, M0, end)
        assert_same(after, before, rel=1e-3)
        with db.session() as session:
            horizon = tiers.tier_state(session)[jobminute.TIER][1]
        assert horizon is not None
        assert horizon <= round(M0 * 1000)
        Writer(db).write([varied("a", M0 + 1200, 0, "wide")])  # the writer keeps it from here on
        assert stored(db)[-1][:3] == (round((M0 + 1200) * 1000), "wide", 2)
    finally:
        db.close()


@pytest.mark.empty_store
def test_the_downgrade_drops_the_aggregate_and_its_horizon(db_url: str) -> None:
    db = Database(db_url)
    try:
        db.upgrade()
        write_cluster(db)
        downgrade(db, "0007")
        with db.session() as session:
            assert not sa.inspect(session.connection()).has_table("job_minute")
            assert jobminute.TIER not in tiers.tier_state(session)
        db.upgrade()
        assert stored(db) == from_samples(db)  # filled again from the samples on the way back up
    finally:
        db.close()
