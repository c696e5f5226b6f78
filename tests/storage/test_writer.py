"""The writer on SQLite and PostgreSQL: idempotent rounds, every field round-trips, change-only side tables."""

from __future__ import annotations

import dataclasses

import pytest
import sqlalchemy as sa

from gpulens.model import NodeSnapshot, TargetHealth
from gpulens.storage import inventory, jobstats, latest, schema
from gpulens.storage.db import Database
from gpulens.storage.writer import Writer
from tests.fakes.static_source import GIB, h100
from tests.storage.conftest import T0
from tests.storage.data import snapshot, uuid_of


def _count(db: Database, table: sa.Table) -> int:
    with db.session() as session:
        return int(session.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def test_same_round_twice_is_stored_once(db: Database) -> None:
    writer = Writer(db)
    rounds = [snapshot("n1", T0), snapshot("n2", T0 + 0.5)]
    first = writer.write(rounds)
    second = writer.write(rounds)
    assert first.gpu_rows == 4
    assert second.gpu_rows == 0
    assert _count(db, schema.gpu_sample) == 4
    # A fresh writer (a restarted collector replaying its spool) does not duplicate either.
    assert Writer(db).write(rounds).gpu_rows == 0
    assert _count(db, schema.gpu_sample) == 4
    assert _count(db, schema.gpu) == 4


def test_duplicates_within_a_round_are_one_row(db: Database) -> None:
    round_ = [snapshot("n1", T0, gpus=1), snapshot("n1", T0, gpus=1, power_watts=100.0)]
    assert Writer(db).write(round_).gpu_rows == 1
    [reading] = latest.latest_readings(db)
    assert reading.power_watts == 100.0  # the later one in the round wins


def test_every_field_round_trips(db: Database) -> None:
    written = h100(
        "node-7",
        3,
        T0 + 0.123,
        xid_errors={79: 1, 48: 2},
        throttle_reasons=0x44,
        remapped_rows_pending=True,
        mig_enabled=True,
        ecc_uncorrected_errors_total=7,
    )
    unset = [f.name for f in dataclasses.fields(written) if getattr(written, f.name) in (None, {})]
    assert unset == [], "h100() must set every field, or this test cannot show that it is stored"
    snap = snapshot("node-7", T0, gpus=0).replace(gpus=(written,))
    Writer(db).write([snap])
    [read] = latest.latest_readings(db)
    for f in dataclasses.fields(written):
        assert getattr(read, f.name) == getattr(written, f.name), f.name
        assert type(getattr(read, f.name)) is type(getattr(written, f.name)), f.name


def test_missing_values_stay_missing(db: Database) -> None:
    reading = h100("n", 0, T0, utilization_ratio=None, power_watts=None, pcie_replays_total=None, up=False)
    Writer(db).write([snapshot("n", T0, gpus=0).replace(gpus=(reading,))])
    [read] = latest.latest_readings(db)
    assert read.utilization_ratio is None
    assert read.power_watts is None
    assert read.pcie_replays_total is None
    assert read.up is False


def test_values_that_do_not_fit_are_stored_as_null(db: Database) -> None:
    reading = h100("n", 0, T0, utilization_ratio=5.0, sm_clock_hertz=1e16)
    stats = Writer(db).write([snapshot("n", T0, gpus=0).replace(gpus=(reading,))])
    assert stats.gpu_rows == 1
    [read] = latest.latest_readings(db)
    assert read.utilization_ratio is None
    assert read.sm_clock_hertz is None
    assert read.power_watts == reading.power_watts


def test_static_info_is_kept_once_and_updated(db: Database) -> None:
    writer = Writer(db)
    writer.write([snapshot("n", T0, gpus=1)])
    writer.write([snapshot("n", T0 + 10, gpus=1, driver_version="560.1")])
    [info] = inventory.gpu_info(db)
    assert info.driver_version == "560.1"
    assert info.first_seen == T0
    assert _count(db, schema.gpu) == 1


def test_jobs_are_intervals_written_on_change(db: Database) -> None:
    writer = Writer(db)
    opened = writer.write([snapshot("n", T0, job="42")])
    same = writer.write([snapshot("n", T0 + 10, job="42")])
    writer.write([snapshot("n", T0 + 20, job="42")])
    closed = writer.write([snapshot("n", T0 + 30)])
    assert opened.job_rows == 2
    assert same.job_rows == 0
    assert closed.job_rows == 2
    a = schema.job_allocation
    with db.session() as session:
        rows = session.execute(sa.select(a.c.job_id, a.c.start_ms, a.c.end_ms, a.c.user_name)).all()
    assert sorted(rows) == [("42", round(T0 * 1000), round((T0 + 20) * 1000), "alice")] * 2


def test_restarted_writer_continues_open_jobs(db: Database) -> None:
    Writer(db).write([snapshot("n", T0, job="42")])
    restarted = Writer(db)
    assert restarted.write([snapshot("n", T0 + 10, job="42")]).job_rows == 0
    restarted.write([snapshot("n", T0 + 20, job="43")])
    [summary_42] = [j for j in jobstats.jobs(db, T0, T0 + 30) if j.job_id == "42"]
    assert summary_42.last_seen == T0 + 10


def test_jobs_opened_and_closed_within_one_write(db: Database) -> None:
    Writer(db).write([snapshot("n", T0, gpus=1, job="7"), snapshot("n", T0 + 10, gpus=1)])
    a = schema.job_allocation
    with db.session() as session:
        rows = session.execute(sa.select(a.c.start_ms, a.c.end_ms)).all()
    assert rows == [(round(T0 * 1000), round(T0 * 1000))]


def test_processes_are_the_latest_reading(db: Database) -> None:
    writer = Writer(db)
    writer.write([snapshot("n", T0, job="42")])
    _, processes = latest.latest_snapshot_parts(db)
    assert [(p.pid, p.job_id, p.memory_used_bytes, p.command) for p in processes] == [
        (4000, "42", 10 * GIB, "python"),
        (4001, "42", 10 * GIB, "python"),
    ]
    assert writer.write([snapshot("n", T0 + 10, job="42")]).process_rows == 0
    writer.write([snapshot("n", T0 + 20)])
    jobs, processes = latest.latest_snapshot_parts(db)
    assert processes == []
    assert jobs == []


def test_old_readings_replayed_do_not_rewind_jobs(db: Database) -> None:
    writer = Writer(db)
    writer.write([snapshot("n", T0 + 10, gpus=1, job="new")])
    stats = writer.write([snapshot("n", T0, gpus=1, job="old")])
    assert stats.gpu_rows == 1
    assert stats.job_rows == 0
    jobs, _ = latest.latest_snapshot_parts(db)
    assert [j.job_id for j in jobs] == ["new"]


@pytest.mark.parametrize("scope", ["all", "inactive"])
def test_only_inactive_links_are_stored(db: Database, scope: str) -> None:
    """The same outage whether the snapshots list every link or, as the collector asks, only the inactive ones."""

    def links(s: NodeSnapshot) -> NodeSnapshot:
        return s.inactive_links() if scope == "inactive" else s

    writer = Writer(db)
    first = writer.write([links(snapshot("n", T0, gpus=1, down_links=()))])
    down = writer.write([links(snapshot("n", T0 + 10, gpus=1, down_links=(2,)))])
    still = writer.write([links(snapshot("n", T0 + 20, gpus=1, down_links=(2,)))])
    back = writer.write([links(snapshot("n", T0 + 30, gpus=1, down_links=()))])
    assert (first.link_rows, down.link_rows, still.link_rows, back.link_rows) == (0, 1, 0, 1)
    [outage] = inventory.link_outages(db, T0, T0 + 60)
    assert (outage.link, outage.since, outage.until, outage.remote_pci_bus_id) == (2, T0 + 10, T0 + 20, "remote-2")
    assert _count(db, schema.nvlink_down) == 1


def test_with_only_inactive_links_a_gpu_whose_links_went_unread_keeps_its_outage(db: Database) -> None:
    """Only the inactive links listed, a GPU that reads no links (``nvlink_links_active`` unknown) is not taken for a
    GPU with every link up: its outage stays open until its links are read again."""
    writer = Writer(db)
    writer.write([snapshot("n", T0, gpus=1, down_links=(2,)).inactive_links()])
    unread = snapshot("n", T0 + 10, gpus=1, down_links=()).inactive_links()
    unread = unread.replace(gpus=tuple(dataclasses.replace(g, nvlink_links_active=None) for g in unread.gpus))
    assert unread.links == ()
    assert writer.write([unread]).link_rows == 0
    assert writer.write([snapshot("n", T0 + 20, gpus=1, down_links=()).inactive_links()]).link_rows == 1
    [outage] = inventory.link_outages(db, T0, T0 + 60)
    assert (outage.link, outage.since, outage.until) == (2, T0, T0 + 10)


def test_target_health_keeps_the_latest(db: Database) -> None:
    writer = Writer(db)
    up = TargetHealth("a", "http://a:9410", "gpulens", T0, True, node="n", scrape_duration_seconds=0.01, samples=8)
    down = dataclasses.replace(up, timestamp=T0 + 10, up=False, last_error="connection refused", samples=0)
    assert writer.write([], [up]).target_rows == 1
    writer.write([], [down])
    writer.write([], [up])  # an older report arriving late does not win
    assert inventory.target_health(db) == [down]


def test_a_gpu_seen_for_the_first_time_in_a_later_round(db: Database) -> None:
    writer = Writer(db)
    writer.write([snapshot("n1", T0)])
    writer.write([snapshot("n1", T0 + 10), snapshot("n2", T0 + 10)])
    assert {r.uuid for r in latest.latest_readings(db)} == {uuid_of(n, i) for n in ("n1", "n2") for i in range(2)}
