"""Migration 0003 on SQLite and PostgreSQL: a store written at 0002 keeps its data, read back in SI units.

The data is written at revision 0002 with the old column names (which held stored units under SI names), then the
store is upgraded; the query API and the SI views must give the same SI values, and new writes must land beside the
old ones.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from gpulens.cli import main
from gpulens.storage import fabric, latest, partitions, schema, timeseries, views
from gpulens.storage.db import MIGRATIONS_DIR, Database
from gpulens.storage.rollup import Rollups
from gpulens.storage.writer import Writer
from tests.storage.conftest import T0
from tests.storage.data import columns_added_after, downgrade, snapshot, uuid_of, write_wide
from tests.storage.fabricdata import fabric_snapshot

MINUTE0 = round(T0 - T0 % 3600) * 1000  # an hour boundary, in ms
UUID = "GPU-0003"
KIB = 1024

# One raw sample at revision 0002, in stored units under the old names; and what it means in SI units.
OLD_SAMPLE = {
    "up": 1,
    "utilization_ratio": 7500,  # 1/10000
    "memory_used_bytes": 20 * 1024 * 1024,  # KiB
    "memory_total_bytes": 80 * 1024 * 1024,
    "temperature_celsius": 455,  # 0.1 degree
    "power_watts": 3125,  # deciwatts
    "energy_joules_total": 5_000_000,  # mJ
    "sm_clock_hertz": 1980,  # MHz
    "pcie_tx_bytes_per_second": 12_345,  # kB/s
    "pcie_replays_total": 3,
    "throttle_reasons": 4,
    "xid_total": 0,
}
SI = {
    "up": True,
    "utilization_ratio": 0.75,
    "memory_used_bytes": 20 * 1024**3,
    "memory_total_bytes": 80 * 1024**3,
    "temperature_celsius": 45.5,
    "power_watts": 312.5,
    "energy_joules_total": 5000.0,
    "sm_clock_hertz": 1.98e9,
    "pcie_tx_bytes_per_second": 12_345_000.0,
    "pcie_replays_total": 3,
    "throttle_reasons": 4,
}
# One 1-minute rollup row at 0002: power 250 W mean (min 200, max 300), 600 J over the minute.
OLD_ROLLUP = {
    "n": 6,
    "elapsed_ms": 60_000,
    "power_watts_min": 2000,
    "power_watts_avg": 2500.0,
    "power_watts_max": 3000,
    "memory_used_bytes_avg": 10.0 * 1024 * 1024,
    "energy_joules_total_inc": 600_000,
}

pytestmark = pytest.mark.empty_store  # each test upgrades an empty store revision by revision


def _known(row: Mapping[str, object]) -> dict[str, object]:
    """A row's non-NULL columns: rows compare alike across revisions that add columns (a later revision's columns
    are NULL in rows written before it, and absent below it), and a value lost to NULL still shows."""
    return {k: v for k, v in row.items() if v is not None}


def _insert(conn: sa.Connection, table: str, row: dict[str, object]) -> None:
    names = ", ".join(row)
    conn.execute(sa.text(f"INSERT INTO {table} ({names}) VALUES ({', '.join(f':{k}' for k in row)})"), row)


def _write_at_0002(db: Database) -> None:
    db.upgrade("0002")
    with db.engine.begin() as conn:
        if db.dialect == "postgresql":
            for table in ("gpu_sample", "gpu_rollup_1m"):
                partitions.create_partition(conn, table, partitions.partition_start(table, MINUTE0))
        gpu = {"uuid": UUID, "node": "old-node", "gpu_index": 3, "model": "NVIDIA H100 80GB HBM3"}
        _insert(conn, "gpu", {**gpu, "first_seen_ms": MINUTE0, "last_seen_ms": MINUTE0 + 90_000})
        gpu_id = conn.execute(sa.text("SELECT id FROM gpu WHERE uuid = :u"), {"u": UUID}).scalar_one()
        _insert(conn, "gpu_sample", {"gpu_id": gpu_id, "ts_ms": MINUTE0 + 90_000, **OLD_SAMPLE})
        _insert(conn, "gpu_rollup_1m", {"gpu_id": gpu_id, "ts_ms": MINUTE0, **OLD_ROLLUP})
        conn.execute(sa.text("UPDATE tier_state SET position_ms = :p WHERE tier = '1m'"), {"p": MINUTE0 + 60_000})
        process = {"gpu_id": gpu_id, "pid": 4711, "seen_ms": MINUTE0 + 90_000, "used_memory_bytes": 7 * 1024**3}
        _insert(conn, "process_latest", process)


def test_upgrade_keeps_the_data_and_reads_it_in_si(db_url: str) -> None:
    db = Database(db_url)
    _write_at_0002(db)
    db.upgrade()

    [reading] = latest.latest_readings(db)
    for name, value in SI.items():
        assert getattr(reading, name) == pytest.approx(value), name
    assert (reading.node, reading.gpu, reading.timestamp) == ("old-node", 3, (MINUTE0 + 90_000) / 1000)
    _, [process] = latest.latest_snapshot_parts(db)
    assert (process.pid, process.memory_used_bytes) == (4711, 7 * 1024**3)

    # Minute 0 from the rollup tier (6 samples, 250 W mean, 200-300 W, 600 J in 60 s), the raw sample after it: one
    # 14-minute bucket (epoch-aligned) merges both.
    start = MINUTE0 / 1000
    data = timeseries.series(db, [UUID], ["power_watts", "energy_joules_total"], start, start + 7200, 10)[UUID]
    assert (data.resolution, data.step_seconds, len(data.timestamps)) == ("1m", 840.0, 1)
    assert data.values["power_watts"][0] == pytest.approx((6 * 250.0 + 312.5) / 7)
    assert (data.minimum["power_watts"][0], data.maximum["power_watts"][0]) == (200.0, 312.5)
    assert data.values["energy_joules_total"][0] == pytest.approx(10.0)

    with db.engine.connect() as conn:
        sample = conn.execute(sa.text("SELECT * FROM gpu_sample_si")).mappings().one()
        rollup = conn.execute(sa.text("SELECT * FROM gpu_rollup_1m_si")).mappings().one()
    for name, value in SI.items():  # booleans are 0/1 in the views
        assert sample[name] == (int(value) if isinstance(value, bool) else pytest.approx(value)), name
    assert (sample["node"], sample["gpu"], sample["uuid"], sample["ts_ms"]) == ("old-node", 3, UUID, MINUTE0 + 90_000)
    assert (rollup["samples"], rollup["elapsed_seconds"]) == (6, pytest.approx(60.0))
    assert (rollup["power_watts_min"], rollup["power_watts_max"]) == (pytest.approx(200.0), pytest.approx(300.0))
    assert rollup["power_watts_mean"] == pytest.approx(250.0)
    assert rollup["memory_used_bytes_mean"] == pytest.approx(10 * 1024**3)
    assert rollup["energy_joules_total_increase"] == pytest.approx(600.0)
    db.close()


def test_new_writes_and_rollups_after_the_upgrade_agree_with_the_views(db_url: str) -> None:
    db = Database(db_url)
    _write_at_0002(db)
    db.upgrade()
    start = MINUTE0 / 1000 + 3600  # an hour after the old data
    Writer(db).write([snapshot("new", start + 10 * k, gpus=1, power_watts=100.0 + k) for k in range(12)])
    Rollups(db, settle_s=0).run(start + 180)
    readings = {r.uuid: r for r in latest.latest_readings(db)}
    assert readings[UUID].power_watts == pytest.approx(312.5)
    assert readings[uuid_of("new", 0)].power_watts == pytest.approx(111.0)
    with db.engine.connect() as conn:
        raw = conn.execute(sa.text("SELECT power_watts FROM gpu_sample_si WHERE node = 'new' ORDER BY ts_ms")).all()
        minutes = conn.execute(
            sa.text("SELECT power_watts_mean, samples FROM gpu_rollup_1m_si WHERE node = 'new' ORDER BY ts_ms")
        ).all()
    assert [row[0] for row in raw] == pytest.approx([100.0 + k for k in range(12)])
    assert [tuple(row) for row in minutes] == [(pytest.approx(102.5), 6), (pytest.approx(108.5), 6)]
    db.close()


def test_a_grafana_panel_query_runs_unchanged(db_url: str) -> None:
    """The query docs/storage.md shows, with Grafana's macros expanded as its PostgreSQL data source does."""
    db = Database(db_url)
    db.upgrade()
    Writer(db).write([snapshot("n", T0 + 10 * k, gpus=2, power_watts=200.0 + k) for k in range(6)])
    if db.dialect == "postgresql":
        lo, hi = (dt.datetime.fromtimestamp(t, tz=dt.UTC).isoformat() for t in (T0, T0 + 30))
        time_filter = f"ts BETWEEN '{lo}' AND '{hi}'"  # $__timeFilter(ts)
    else:
        lo, hi = (dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z") for t in (T0, T0 + 30))
        time_filter = f"ts BETWEEN '{lo}' AND '{hi}'"
    panel = (
        "SELECT ts AS \"time\", node || ':' || gpu AS metric, power_watts FROM gpu_sample_si "
        f"WHERE {time_filter} ORDER BY 1, 2"
    )
    # The form that prunes partitions: $__unixEpochFrom() and $__unixEpochTo() are seconds, integers (int4 on
    # PostgreSQL, hence the cast before * 1000).
    by_epoch = (
        "SELECT node || ':' || gpu AS metric, power_watts FROM gpu_sample_si "
        f"WHERE ts_ms >= CAST({T0:.0f} AS BIGINT) * 1000 AND ts_ms <= CAST({T0 + 30:.0f} AS BIGINT) * 1000 "
        "ORDER BY ts_ms, metric"
    )
    with db.engine.connect() as conn:
        rows = conn.execute(sa.text(panel)).all()
        epoch_rows = conn.execute(sa.text(by_epoch)).all()
    assert [(row.metric, row.power_watts) for row in rows] == [
        (f"n:{gpu}", pytest.approx(200.0 + k)) for k in range(4) for gpu in range(2)
    ]
    assert [tuple(row) for row in epoch_rows] == [(row.metric, row.power_watts) for row in rows]
    if db.dialect == "postgresql":
        assert isinstance(rows[0].time, dt.datetime)
        assert rows[0].time.timestamp() == T0
    db.close()


def test_downgrade_renames_back_and_drops_the_views(db_url: str) -> None:
    db = Database(db_url)
    _write_at_0002(db)
    db.upgrade()
    downgrade(db, "0002")
    with db.engine.connect() as conn:
        inspector = sa.inspect(conn)
        assert not set(views.VIEWS.values()) & set(inspector.get_view_names())
        power = conn.execute(sa.text("SELECT power_watts FROM gpu_sample")).scalar_one()
        increase = conn.execute(sa.text("SELECT energy_joules_total_inc FROM gpu_rollup_1m")).scalar_one()
        memory = conn.execute(sa.text("SELECT used_memory_bytes FROM process_latest")).scalar_one()
    assert (power, increase, memory) == (3125, 600_000, 7 * 1024**3)
    db.upgrade()
    [reading] = latest.latest_readings(db)
    assert reading.power_watts == pytest.approx(312.5)
    db.close()


def test_gpulens_db_upgrade_migrates_an_existing_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/old.db"
    db = Database(url)
    _write_at_0002(db)
    assert main(["db", "upgrade", "--db", url]) == 0
    head = Database.head_revision()
    assert capsys.readouterr().out.splitlines() == [
        f"{url}: upgrading the schema from revision 0002 to {head}; a revision that copies the sample tables takes "
        "about as long as writing them",
        f"{url}: schema up to date (revision {head})",
    ]
    assert main(["db", "upgrade", "--db", url]) == 0  # nothing to do: no announcement
    assert capsys.readouterr().out.splitlines() == [f"{url}: schema up to date (revision {head})"]
    with db.engine.connect() as conn:
        version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
        assert version == ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
        assert conn.execute(sa.text("SELECT power_deciwatts FROM gpu_sample")).scalar_one() == 3125
        assert conn.execute(sa.text("SELECT power_watts FROM gpu_sample_si")).scalar_one() == pytest.approx(312.5)
    db.close()


def test_0004_narrows_the_columns_and_keeps_every_value(db_url: str) -> None:
    """A store written before 0004 (wider types on PostgreSQL) reads the same through the SI view after it and the
    later revisions, and the current writer goes on writing to it."""
    db = Database(db_url)
    _write_at_0002(db)
    db.upgrade("0003")
    with db.engine.connect() as conn:
        before = dict(conn.execute(sa.text("SELECT * FROM gpu_sample_si")).mappings().one())
    db.upgrade()
    with db.engine.connect() as conn:
        after = dict(conn.execute(sa.text("SELECT * FROM gpu_sample_si")).mappings().one())
        if db.dialect == "postgresql":
            types: dict[str, str] = dict(
                conn.execute(
                    sa.text(
                        "SELECT column_name, data_type FROM information_schema.columns "
                        "WHERE table_name = 'gpu_sample' AND column_name IN ('sm_clock_mhz', 'memory_used_kib')"
                    )
                ).all()
            )
            assert types == {"sm_clock_mhz": "smallint", "memory_used_kib": "integer"}
    for name, value in before.items():
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        assert after[name] == (pytest.approx(value) if numeric else value), name
    assert after["encoder_utilization_ratio"] is None  # 0005's new fields are unknown in old rows
    Writer(db).write([snapshot("n", T0 + 100, gpus=2, job="j", power_watts=400.0)])
    assert {r.power_watts for r in latest.latest_readings(db) if r.node == "n"} == {400.0}
    db.close()


def test_0006_adds_the_fabric_tables_to_a_store_at_0005(db_url: str) -> None:
    """A store at 0005 keeps its GPU rows through 0006, then takes ports, hosts and jobs' hosts; downgrading drops
    only the new tables."""
    db = Database(db_url)
    db.upgrade("0005")
    write_wide(db, [snapshot("n", T0, gpus=2, power_watts=300.0)])
    db.upgrade()
    assert {r.power_watts for r in latest.latest_readings(db)} == {300.0}
    Writer(db).write([fabric_snapshot("n", T0 + 10, 1)])
    assert [n.device for n in fabric.latest_nics(db)] == ["mlx5_0", "mlx5_1"]
    assert [h.node for h in fabric.latest_hosts(db)] == ["n"]
    downgrade(db, "0005")
    with db.engine.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
    assert not tables & {"nic", "nic_sample", "host_rollup_1m", "job_host_rollup_1h"}
    assert {"gpu", "gpu_sample"} <= tables
    db.close()


def _roll_up_wide(db: Database, hours_before: float) -> None:
    """Rollup rows (samples, mean power) written as plain SQL, as Rollups reads the samples of the current revision:
    a minute row for every minute of samples, an hour row for the hours before ``hours_before``."""
    with db.engine.begin() as conn:
        for table, width, before in (("gpu_rollup_1m", 60_000, None), ("gpu_rollup_1h", 3_600_000, hours_before)):
            if db.dialect == "postgresql":
                for (ts,) in conn.execute(sa.text("SELECT DISTINCT ts_ms FROM gpu_sample")).all():
                    partitions.create_partition(conn, table, partitions.partition_start(table, ts))
            conn.execute(
                sa.text(
                    f"INSERT INTO {table} (gpu_id, ts_ms, n, elapsed_ms, power_deciwatts_mean) "
                    f"SELECT gpu_id, ts_ms / {width} * {width}, count(*), 0, avg(power_deciwatts) FROM gpu_sample "
                    f"WHERE ts_ms < :before GROUP BY gpu_id, ts_ms / {width}"
                ),
                {"before": round((before or 1e12) * 1000)},
            )


_TABLES_0007 = ("gpu_sample", "gpu_rollup_1m", "gpu_rollup_1h")


def _stored_rows(db: Database) -> dict[str, list[dict[str, object]]]:
    with db.engine.connect() as conn:
        return {
            table: [
                _known(row) for row in conn.execute(sa.text(f"SELECT * FROM {table}_si ORDER BY ts_ms, gpu")).mappings()
            ]
            for table in _TABLES_0007
        }


def _pg_layout(db: Database) -> dict[str, tuple[list[str], list[str], list[int], list[str]]]:
    """Per table: its partitions, its partitions' index names, the widths of its columns in order, its indexes."""
    widths = {"bigint": 8, "double precision": 8, "integer": 4, "smallint": 2}
    indexes = sa.text("SELECT indexname FROM pg_indexes WHERE tablename LIKE :t ORDER BY 1")
    columns = sa.text(
        "SELECT data_type FROM information_schema.columns WHERE table_name = :t "
        "AND table_schema = current_schema() ORDER BY ordinal_position"
    )
    with db.engine.connect() as conn:
        return {
            table: (
                sorted(partitions.existing_partitions(conn, table)),
                list(conn.execute(indexes, {"t": f"{table}_p%"}).scalars()),
                [widths.get(kind, 0) for kind in conn.execute(columns, {"t": table}).scalars()],
                list(conn.execute(indexes, {"t": table}).scalars()),
            )
            for table in _TABLES_0007
        }


def test_0007_orders_the_columns_widest_first_and_keeps_every_row(db_url: str) -> None:
    """Samples in two day partitions and their rollups read the same through the SI views after 0007; on PostgreSQL
    the columns go 8-byte types, integers, smallints, then the text, in partitions and indexes of the same names, and
    the writer's idempotent insert (which needs the unique index) goes on working."""
    db = Database(db_url)
    db.upgrade("0006")
    write_wide(db, [snapshot("n", T0, gpus=2, job="j", power_watts=300.0, xid_errors={79: 2})])
    write_wide(db, [snapshot("n", T0 + 10, gpus=2, job="j", power_watts=320.0)])
    write_wide(db, [snapshot("n", T0 + 86_400, gpus=2, power_watts=350.5, memory_used_bytes=5 * 2**30)])
    _roll_up_wide(db, T0 + 86_400)
    before = _stored_rows(db)
    layout = _pg_layout(db) if db.dialect == "postgresql" else {}
    db.upgrade("0007")
    assert _stored_rows(db) == before
    assert [len(before[table]) for table in _TABLES_0007] == [6, 4, 2]
    if db.dialect == "postgresql":
        after = _pg_layout(db)
        for table in _TABLES_0007:
            partitions, partition_indexes, widths, indexes = after[table]
            old_partitions, old_partition_indexes, old_widths, old_indexes = layout[table]
            assert (partitions, partition_indexes, indexes) == (old_partitions, old_partition_indexes, old_indexes)
            assert len(partitions) >= (1 if table == "gpu_rollup_1h" else 2)
            assert widths == sorted(old_widths, reverse=True) != old_widths
        assert after["gpu_sample"][3] == ["ix_gpu_sample_ts_brin", "ux_gpu_sample_gpu_ts"]
        assert after["gpu_sample"][2][-1] == 0  # xid_errors, the text, last
    db.upgrade()
    assert _stored_rows(db) == before
    assert Writer(db).write([snapshot("n", T0 + 86_400, gpus=2)]).gpu_rows == 0  # stored already: skipped
    assert Writer(db).write([snapshot("n", T0 + 86_410, gpus=2, power_watts=400.0)]).gpu_rows == 2
    assert {r.power_watts for r in latest.latest_readings(db)} == {400.0}
    db.close()


_SAMPLE_TABLES = {
    "gpu_sample": "gpu_id",
    "nic_sample": "nic_id",
    "host_sample": "host_id",
    "job_host_sample": "job_host_id",
}


def _sample_rows(db: Database) -> dict[str, list[dict[str, object]]]:
    """Every raw sample table's rows, by key and time, without SQLite's stored minute (which 0009 lacks) and
    millisecond (which 0010 lacks), and without the columns added after 0011 (which a downgrade to 0010 drops)."""
    skip = {"minute", "ms", *columns_added_after("0011")}
    with db.engine.connect() as conn:
        return {
            table: [
                {k: v for k, v in _known(row).items() if k not in skip}
                for row in conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY {key}, ts_ms")).mappings()
            ]
            for table, key in _SAMPLE_TABLES.items()
        }


def _sqlite_layout(db: Database) -> dict[str, tuple[bool, list[str]]]:
    """Per sample table: whether it is WITHOUT ROWID, and its indexes' names (SQLite)."""
    with db.engine.connect() as conn:
        return {
            table: (
                str(conn.execute(sa.text("SELECT sql FROM sqlite_master WHERE name = :t"), {"t": table}).scalar_one())
                .rstrip()
                .endswith("WITHOUT ROWID"),
                sorted(
                    str(name)
                    for name in conn.execute(
                        sa.text("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = :t"), {"t": table}
                    ).scalars()
                ),
            )
            for table in _SAMPLE_TABLES
        }


def test_0010_clusters_sqlites_samples_by_minute_and_keeps_every_row(db_url: str) -> None:
    """GPU and fabric samples over two minutes and two days: the same rows after 0010's downgrade and upgrade again;
    on SQLite a heap with the minute expression index at 0009 and a WITHOUT ROWID table with no index after; views
    read again; the writer skips a round stored already, and a new one lands and reads as the newest."""
    db = Database(db_url)
    written, views_before = _write_samples(db, (T0, T0 + 10, T0 + 70, T0 + 86_400))
    downgrade(db, "0009")
    assert _sample_rows(db) == written
    if db.dialect == "sqlite":
        assert _sqlite_layout(db) == {
            "gpu_sample": (False, ["ux_gpu_sample_minute_gpu_ts"]),
            **{t: (False, [f"ux_{t}_minute_key_ts"]) for t in ("nic_sample", "host_sample", "job_host_sample")},
        }
    db.upgrade()
    assert _sample_rows(db) == written
    assert _view_rows(db) == views_before
    if db.dialect == "sqlite":
        assert _sqlite_layout(db) == {t: (True, []) for t in _SAMPLE_TABLES}
        with db.engine.connect() as conn:
            mismatched = conn.execute(
                sa.text(f"SELECT count(*) FROM gpu_sample WHERE minute != {schema.minute_of('ts_ms')}")
            )
            assert mismatched.scalar_one() == 0
    _skips_a_stored_round_and_adds_a_new_one(db)
    db.close()


def test_0011_stores_sqlites_sample_time_in_two_small_integers_and_keeps_every_row(db_url: str) -> None:
    """Samples over two minutes and two days, one on a minute's first millisecond and one on its last: the same
    rows and times after 0011's downgrade and upgrade again; on SQLite the minute counted from 2020 and the
    millisecond within it less half a minute, a key of (minute, key, ms), ts_ms generated and stored in no record;
    the writer skips a round stored already, and a new one lands and reads as the newest."""
    db = Database(db_url)
    first, last = T0 - T0 % 60, T0 - T0 % 60 + 59.999  # a minute's first and last millisecond
    written, views_before = _write_samples(db, (first, last, T0 + 70, T0 + 86_400))
    downgrade(db, "0010")
    assert _sample_rows(db) == written
    db.upgrade()
    assert _sample_rows(db) == written
    assert _view_rows(db) == views_before
    if db.dialect == "sqlite":
        with db.engine.connect() as conn:
            for table, key in _SAMPLE_TABLES.items():
                keyed = conn.execute(sa.text(f"SELECT name FROM pragma_index_info('sqlite_autoindex_{table}_1')"))
                assert list(keyed.scalars()) == ["minute", key, "ms"]
                stored = {str(r[1]) for r in conn.execute(sa.text(f"PRAGMA table_info({table})"))}
                assert "ts_ms" not in stored  # generated: in no record
                assert {"minute", "ms"} <= stored
                minutes = f"SELECT min(minute), max(minute), min(ms), max(ms), count(*) FROM {table}"
                low, high, low_ms, high_ms, _ = conn.execute(sa.text(minutes)).one()
                assert (low, high) == (
                    schema.stored_minute(round(first * 1000)),
                    schema.stored_minute(round((T0 + 86_400) * 1000)),
                )
                assert low_ms >= -30_000
                assert high_ms <= 29_999
            edges = conn.execute(sa.text("SELECT DISTINCT ms FROM gpu_sample WHERE ms IN (-30000, 29999)"))
            assert sorted(edges.scalars()) == [-30_000, 29_999]
    _skips_a_stored_round_and_adds_a_new_one(db)
    db.close()


def _write_samples(
    db: Database, times: tuple[float, ...]
) -> tuple[dict[str, list[dict[str, object]]], dict[str, list[dict[str, object]]]]:
    """Upgrade, write GPU and fabric rounds of two nodes at ``times`` (the last a day later), and return every sample
    table's rows and the SI views' rows."""
    db.upgrade()
    writer = Writer(db)
    for i, t in enumerate(times):
        writer.write([fabric_snapshot("n", t, i), fabric_snapshot("m", t, i, job=None)])
    written = _sample_rows(db)
    assert [len(written[t]) for t in _SAMPLE_TABLES] == [16, 16, 8, 4]
    return written, _view_rows(db)


def _skips_a_stored_round_and_adds_a_new_one(db: Database) -> None:
    """A new writer skips round 3 (stored already at T0 + 86,400) and lands round 4, which reads as the newest."""
    again = Writer(db)
    assert again.write([fabric_snapshot("n", T0 + 86_400, 3)]).gpu_rows == 0  # stored already: skipped
    assert again.write([fabric_snapshot("n", T0 + 86_410, 4)]).gpu_rows == 2
    assert {r.timestamp for r in latest.latest_readings(db) if r.node == "n"} == {T0 + 86_410}
    assert {n.transmit_bytes_total for n in fabric.latest_nics(db, node="n")} == {4 * 10**9}  # round 4's


def _view_rows(db: Database) -> dict[str, list[dict[str, object]]]:
    """The SI views' rows, without the fields added after 0011 (which a downgrade to 0010 drops)."""
    skip = columns_added_after("0011")
    with db.engine.connect() as conn:
        return {
            view: [
                {k: v for k, v in _known(r).items() if k not in skip}
                for r in conn.execute(sa.text(f"SELECT * FROM {view} ORDER BY 1, 2, 3")).mappings()
            ]
            for view in ("gpu_sample_si", "nic_sample_si", "host_sample_si")
        }
