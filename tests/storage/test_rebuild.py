"""The rollup rebuild on SQLite and PostgreSQL: the live rollup's rows and the writer's job minutes, again from the
raw samples, chunk by chunk, with progress; idempotent, and bounded in statements whatever the cluster's size."""

from __future__ import annotations

import dataclasses

import pytest
from sqlalchemy import event

from gpulens.cli import main
from gpulens.clock import ManualClock
from gpulens.fabricmodel import HostReading, JobHostReading
from gpulens.storage import rebuild
from gpulens.storage.db import Database
from gpulens.storage.fabricschema import FAMILIES
from gpulens.storage.rollup import Rollups
from gpulens.storage.writer import Writer
from tests.storage.conftest import T0
from tests.storage.data import snapshot
from tests.storage.fabricdata import GIB, nic

H0 = T0 - T0 % 3600 + 3600  # an hour boundary
STEP = 20.0
HOURS = 2
KEYS = {f.table(tier): f"{f.key}, ts_ms" for f in FAMILIES for tier in ("1m", "1h")} | {"job_minute": "job_id, ts_ms"}
TABLES = list(KEYS)


def _write(db: Database, clock: ManualClock, nodes: int, minutes: int, offset: float = 0.0) -> float:
    """Rounds every STEP s of ``nodes`` nodes with every family, a job on the even nodes, and an energy counter that
    resets at minute 70 (the rebuild counts a drop from zero, as the live rollup does). Returns the time after."""
    writer = Writer(db)
    rounds = round(minutes * 60 / STEP)
    for i in range(rounds):
        t = H0 + offset + STEP * i
        energy = 1000.0 * (i if i < 210 else i - 200)
        batch = []
        for n in range(nodes):
            node = f"n{n}"
            job = "j1" if n % 2 == 0 else None
            base = snapshot(node, t, gpus=2, job=job, power_watts=100.0 + (i * 7 + n) % 300, energy_joules_total=energy)
            batch.append(
                dataclasses.replace(
                    base,
                    nics=tuple(nic(node, k, i) for k in range(2)),
                    host=HostReading(node, 64, (i % 10) / 10, 0.02, 2048 * GIB, 512 * GIB, 1536 * GIB),
                    job_hosts=(JobHostReading(node, "j1", "/slurm/j1", 2, 100.0 + 40.0 * i, 8.0, GIB, 4 * GIB, 4.0),)
                    if job
                    else (),
                )
            )
        writer.write(batch)
    now = H0 + offset + STEP * rounds
    clock.set(now)
    return now


def _tables(db: Database, below_ms: int) -> dict[str, list[tuple[object, ...]]]:
    with db.engine.connect() as conn:
        return {
            table: [
                tuple(row)
                for row in conn.exec_driver_sql(
                    f"SELECT * FROM {table} WHERE ts_ms < {below_ms} ORDER BY {KEYS[table]}"
                )
            ]
            for table in TABLES
        }


def _positions(db: Database) -> dict[str, int | None]:
    with db.engine.connect() as conn:
        return dict(conn.exec_driver_sql("SELECT tier, position_ms FROM tier_state WHERE tier IN ('1m', '1h')").all())


def test_the_rebuild_gives_the_live_rollups_and_job_minutes(db: Database, clock: ManualClock) -> None:
    now = _write(db, clock, nodes=2, minutes=HOURS * 60 + 5)
    Rollups(db, settle_s=0).run(now)
    end_ms = round((H0 + HOURS * 3600) * 1000)
    live = _tables(db, end_ms)
    assert all(live[t] for t in TABLES), {t: len(rows) for t, rows in live.items()}  # every family was rolled up
    positions = _positions(db)
    with db.write_transaction() as conn:  # spoil what the rebuild must restore: a row gone, a row wrong
        conn.exec_driver_sql(f"DELETE FROM gpu_rollup_1m WHERE ts_ms = {round(H0 * 1000) + 600_000}")
        conn.exec_driver_sql("UPDATE nic_rollup_1h SET n = 1")
        conn.exec_driver_sql("UPDATE job_minute SET util_n = 0")
    progress: list[rebuild.Progress] = []
    written = rebuild.rebuild(db, H0 - 7200, now, chunk_minutes=20, progress=progress.append)
    assert _tables(db, end_ms) == live
    assert written == sum(len(rows) for table, rows in live.items() if table != "job_minute")
    assert _positions(db) == positions  # a rebuild below the positions leaves them
    assert [p.chunks_done for p in progress] == list(range(HOURS * 3 + 1))  # from the first sample's hour
    assert {p.chunks_total for p in progress} == {HOURS * 3}
    rows = [p.rows for p in progress]
    assert rows == sorted(rows)
    assert rows[-1] == written
    assert progress[0].eta_s is None
    assert progress[-1].eta_s == 0


def test_a_rebuild_past_the_positions_moves_them_as_the_live_rollup_would(db: Database, clock: ManualClock) -> None:
    now = _write(db, clock, nodes=1, minutes=HOURS * 60 + 5)
    assert _positions(db) == {"1m": None, "1h": None}  # the live rollup never ran (an outage)
    rebuild.rebuild(db, 0, now, chunk_minutes=60)
    end_ms = round((H0 + HOURS * 3600) * 1000)
    assert _positions(db) == {"1m": end_ms, "1h": end_ms}
    rebuilt = _tables(db, end_ms)
    with db.write_transaction() as conn:
        for table in TABLES[:-1]:
            conn.exec_driver_sql(f"DELETE FROM {table}")
        conn.exec_driver_sql("UPDATE tier_state SET position_ms = NULL WHERE tier IN ('1m', '1h')")
    Rollups(db, settle_s=0).run(now)
    assert _tables(db, end_ms) == rebuilt


def _count_statements(db: Database, start: float, end: float) -> int:
    seen: list[object] = []

    def count(*args: object) -> None:
        seen.append(args[2])

    event.listen(db.engine, "before_cursor_execute", count)
    try:
        rebuild.rebuild(db, start, end, chunk_minutes=20)
    finally:
        event.remove(db.engine, "before_cursor_execute", count)
    return len(seen)


def test_the_rebuild_is_idempotent_and_its_statements_do_not_grow_with_the_cluster(
    db: Database, clock: ManualClock
) -> None:
    _write(db, clock, nodes=1, minutes=60)  # the first hour: one node
    now = _write(db, clock, nodes=4, minutes=60, offset=3600)  # the second: four
    rebuild.rebuild(db, H0, now, chunk_minutes=20)
    first = _tables(db, round(now * 1000))
    assert [len(first["gpu_rollup_1m"]), len(first["gpu_rollup_1h"])] == [2 * 60 + 8 * 60, 2 + 8]
    small = _count_statements(db, H0, H0 + 3600)
    large = _count_statements(db, H0 + 3600, H0 + 7200)
    assert small == large  # 4 times the GPUs, ports, hosts and jobs: the same statements
    # per chunk: its locks, 2 x 4 families x (delete + insert), the job minutes, the positions; the span read
    assert large <= 3 * 30 + 10
    assert _tables(db, round(now * 1000)) == first  # rebuilt again, the same rows


def test_a_chunk_that_is_not_a_divisor_or_multiple_of_an_hour_is_refused() -> None:
    with pytest.raises(ValueError, match="divisor of 60"):
        rebuild.chunks(0, 3_600_000, 7)
    assert rebuild.chunks(0, 3 * 3_600_000, 120) == [(0, 7_200_000), (7_200_000, 10_800_000)]
    assert rebuild.chunks(1_000, 3_600_000 + 5, 30) == [(0, 1_800_000), (1_800_000, 3_600_000)]


def test_the_command_prints_progress_on_stderr_and_the_rows_on_stdout(
    db: Database, db_url: str, clock: ManualClock, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(db, clock, nodes=1, minutes=65)
    assert main(["db", "rebuild-rollups", "--since", "10000d", "--chunk-minutes", "30", "--db", db_url]) == 0
    out, err = capsys.readouterr()
    # Two hours (the last one ended long ago, with the samples), two chunks each; not a terminal: a line at 0 and
    # after each chunk (every 5% of 4 chunks)
    lines = err.splitlines()
    assert [line.split(",")[0] for line in lines] == [f"rebuild: {n}/4 chunks ({n * 25}%)" for n in range(5)]
    assert "left" in lines[1]
    rows = 2 * 60 + 2  # the first whole hour's minutes and hour of 2 GPUs, and of their ports, host and job
    assert out.strip().endswith("rollup rows rebuilt")
    assert int(out.split(": ")[-1].split()[0].replace(",", "")) >= rows
    assert main(["db", "rebuild-rollups", "--chunk-minutes", "7", "--db", db_url]) == 1
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("--chunk-minutes: chunk of 7 minutes: give a divisor of 60 or a multiple of 60")
    )
