"""``gpulens report --by user|account|partition``: GPU-hours, idle share, energy, cost and hung jobs per group.

A demo-like store: over the last twenty minutes alice's job "train" holds two GPUs of n1 (one busy, one idle) and
ends; bob's job "serve" holds n2's GPU, busy, and runs on; a CommunicationStall about "train" fired for 150 s.
Slurm's metadata puts both in partition "gpu", alice's job in account "proj-a" and bob's in "proj-b".
"""

from __future__ import annotations

import csv
import io
import json
import time

import pytest

from gpulens.cli import main
from gpulens.clock import ManualClock
from gpulens.model import GpuJob, JobInfo, NodeSnapshot
from gpulens.settings import Prices
from gpulens.storage import usagereport
from gpulens.storage.alertstore import save_alert_round
from gpulens.storage.db import Database
from gpulens.storage.writer import Writer
from tests.fakes.static_source import h100

STEP = 10.0
ROUNDS = 61
PRICES = Prices(per_gpu_hour=2.0, currency="EUR")


def _demo_like(db: Database, clock: ManualClock, start: float) -> None:
    writer = Writer(db)
    info = (JobInfo("n1", "train", user="alice", account="proj-a", partition="gpu"),)
    served = (JobInfo("n2", "serve", user="bob", account="proj-b", partition="gpu"),)
    for k in range(ROUNDS + 1):
        t = start + k * STEP
        clock.set(t)
        busy = h100("n1", 0, t, energy_joules_total=k * 6000.0)  # 600 W
        idle = h100("n1", 1, t, utilization_ratio=0.0)  # its energy counter stands still
        other = h100("n2", 0, t)
        jobs = tuple(GpuJob("n1", g.gpu, g.uuid, "train", "alice") for g in (busy, idle)) if k < ROUNDS else ()
        writer.write(
            [
                NodeSnapshot("n1", t, "test", gpus=(busy, idle), jobs=jobs, job_info=info if jobs else ()),
                NodeSnapshot(
                    "n2", t, "test", gpus=(other,), jobs=(GpuJob("n2", 0, other.uuid, "serve", "bob"),), job_info=served
                ),
            ]
        )
    stall = {"fingerprint": "f1", "rule": "CommunicationStall", "labels": {"job_id": "train"}, "value": None}
    for at, state in ((start + 100, "firing"), (start + 250, "resolved")):
        save_alert_round(db, states=[], removed=[], groups={}, now=at, transitions=[{**stall, "state": state}])


@pytest.fixture
def store(db_url: str) -> str:
    start = time.time() - 1200
    clock = ManualClock(start)
    db = Database(db_url, clock=clock)
    try:
        _demo_like(db, clock, start)
    finally:
        db.close()
    return db_url


def test_report_by_user_lists_each_users_gpu_hours_and_idle_share(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--by", "user", "--since", "1d", "--db", store, "--json"]) == 0
    rows = {r["group"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"alice", "bob"}
    alice, bob = rows["alice"], rows["bob"]
    assert alice["gpu_hours"] == pytest.approx(2 * 600 / 3600)
    assert alice["idle_ratio"] == pytest.approx(0.5)
    assert alice["used_gpu_hours"] == pytest.approx(600 / 3600)
    assert (alice["hung_jobs"], alice["hung_seconds"]) == (1, pytest.approx(150.0))
    assert bob["idle_ratio"] == pytest.approx(0.0)
    assert bob["hung_jobs"] == 0
    assert bob["gpu_hours"] > 0
    assert alice["energy_kwh"] == pytest.approx(60 * 6000 / 3.6e6)
    assert main(["report", "--by", "user", "--since", "1d", "--db", store]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:5] == ["USER", "JOBS", "GPU_HOURS", "USED_GPU_HOURS", "IDLE"]
    assert any(line.startswith("alice") and "50.0%" in line and "1 (2 min)" in line for line in table)


def test_report_by_account_and_partition_from_slurms_metadata(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", "--by", "account", "--since", "1d", "--db", store, "--csv"]) == 0
    rows = {r["group"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert set(rows) == {"proj-a", "proj-b"}
    assert float(rows["proj-a"]["idle_ratio"]) == pytest.approx(0.5)
    assert main(["report", "--by", "partition", "--since", "1d", "--db", store, "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["group"], row["jobs"]) == ("gpu", 2)


def test_a_period_before_the_jobs_has_no_rows(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    db = Database(store)
    try:
        assert usagereport.usage(db, "user", 0.0, 1.0, PRICES) == []
    finally:
        db.close()
    assert main(["report", "--by", "user", "--since", "1d", "--db", store]) == 0
    assert "alice" in capsys.readouterr().out


def test_the_idle_trend_adds_up_to_the_reports_idle_share(store: str) -> None:
    from gpulens.storage import idletrend

    db = Database(store)
    try:
        end = time.time()
        start = end - 1800
        rows = {r.group: r for r in usagereport.usage(db, "user", start, end, PRICES)}
        step = idletrend.step_for(end - start)
        assert step == 300.0  # 1800 s in 300 s buckets: 6 at most
        points = idletrend.idle_trend(db, "user", start, end, step, PRICES)
        assert {p.start for p in points} <= {start + k * step for k in range(6)}
        for user in ("alice", "bob"):
            mine = [p for p in points if p.group == user]
            assert sum(p.idle_samples for p in mine) / sum(p.samples for p in mine) == pytest.approx(
                rows[user].idle_ratio
            )
        by_account = {p.group for p in idletrend.idle_trend(db, "account", start, end, step, PRICES)}
        assert by_account == {"proj-a", "proj-b"}
        assert idletrend.idle_trend(db, "user", 0.0, 1.0, 300.0, PRICES) == []
    finally:
        db.close()


def test_the_command_over_a_prometheus_that_does_not_answer_says_so_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["report", "--by", "user", "--db", "prometheus+http://127.0.0.1:9"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "127.0.0.1:9" in err
