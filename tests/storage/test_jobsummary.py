"""Job accounting: a job's summary from stored rounds, stored once it ends, and `gpulens job-summary`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpulens.cli import main
from gpulens.clock import ManualClock
from gpulens.model import GpuJob, NodeSnapshot
from gpulens.settings import Prices
from gpulens.storage import jobsummary
from gpulens.storage.alertstore import save_alert_round
from gpulens.storage.db import Database
from gpulens.storage.writer import Writer
from tests.fakes.static_source import GIB, h100
from tests.storage.conftest import T0

PRICES = Prices(per_gpu_hour=2.0, per_kwh=0.3, currency="EUR", carbon_gco2e_per_kwh=400.0, idle_utilization=0.05)
STEP = 10.0
ROUNDS = 61  # T0 .. T0 + 600 s


def rounds(db: Database, clock: ManualClock) -> None:
    """Job "train" holds two GPUs of n1 for 600 s: GPU 0 busy, with an energy counter that resets half way; GPU 1
    idle and without a counter (its energy comes from its power). Job "serve" holds n2's GPU from T0 and runs on.
    Then a round without "train"."""
    writer = Writer(db)
    for k in range(ROUNDS + 1):
        t = T0 + k * STEP
        clock.set(t)
        energy = (k if k < 30 else k - 30) * 6000.0  # J: 600 W; the counter restarts at round 30
        busy = h100("n1", 0, t, energy_joules_total=energy, power_watts=600.0, memory_used_bytes=70 * GIB)
        idle = h100("n1", 1, t, energy_joules_total=None, power_watts=300.0, utilization_ratio=0.0)
        other = h100("n2", 0, t)
        jobs = tuple(GpuJob("n1", g.gpu, g.uuid, "train", "alice") for g in (busy, idle)) if k < ROUNDS else ()
        writer.write(
            [
                NodeSnapshot("n1", t, "test", gpus=(busy, idle), jobs=jobs),
                NodeSnapshot("n2", t, "test", gpus=(other,), jobs=(GpuJob("n2", 0, other.uuid, "serve", "bob"),)),
            ]
        )
    stall = {"fingerprint": "f1", "rule": "CommunicationStall", "labels": {"job_id": "train"}, "value": None}
    elsewhere = {**stall, "fingerprint": "f2", "labels": {"job_id": "serve"}}
    for at, state in ((T0 + 100, "firing"), (T0 + 250, "resolved")):
        save_alert_round(
            db, states=[], removed=[], groups={}, now=at,
            transitions=[{**stall, "state": state}, {**elsewhere, "state": state}],
        )  # fmt: skip


def test_an_ended_jobs_summary_from_its_stored_rounds(db: Database, clock: ManualClock) -> None:
    rounds(db, clock)
    account = jobsummary.summarise(db, "train", PRICES, now=T0 + 700)
    assert account is not None
    assert account.ended
    assert (account.start, account.end, account.gpus, account.nodes) == (T0, T0 + 600, 2, ("n1",))
    assert account.gpu_hours == pytest.approx(2 * 600 / 3600)
    # GPU 0: 59 of its 60 intervals at 6 kJ (the reset's interval is lost); GPU 1: 300 W for 600 s.
    assert account.energy_kwh == pytest.approx((59 * 6000 + 300 * 600) / 3.6e6)
    assert account.energy_from == "counter+power"
    assert account.utilization_mean == pytest.approx(0.97 / 2)
    assert account.memory_peak_bytes == 70 * GIB
    assert account.idle_ratio == pytest.approx(0.5)
    assert account.stall_seconds == pytest.approx(150.0)
    kwh = account.energy_kwh
    assert account.cost == pytest.approx(account.gpu_hours * 2.0 + kwh * 0.3)
    assert account.carbon_gco2e == pytest.approx(kwh * 400.0)
    assert account.currency == "EUR"


def test_ended_jobs_are_summarised_once_and_running_ones_not(db: Database, clock: ManualClock) -> None:
    rounds(db, clock)
    assert jobsummary.account_ended(db, PRICES, now=T0 + 610) == []  # ended, but not ENDED_AFTER_S ago
    later = T0 + 600 + jobsummary.ENDED_AFTER_S + 1
    assert jobsummary.account_ended(db, PRICES, now=later) == ["train"]
    assert jobsummary.account_ended(db, PRICES, now=later + 60) == []
    assert jobsummary.stored(db, "train") == jobsummary.summarise(db, "train", PRICES, now=later)
    assert jobsummary.stored(db, "serve") is None
    running = jobsummary.summarise(db, "serve", PRICES, now=T0 + 610)
    assert running is not None
    assert not running.ended
    assert running.stall_seconds == pytest.approx(150.0)
    assert jobsummary.summarise(db, "nope", PRICES, now=later) is None


def test_the_cli_prints_the_stored_summary(
    db: Database, db_url: str, clock: ManualClock, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rounds(db, clock)
    jobsummary.account_ended(db, PRICES, now=T0 + 1000)
    config = tmp_path / "gpulens.toml"
    config.write_text("[accounting]\nprice_per_gpu_hour = 2.0\ncurrency = 'EUR'\n")
    assert main(["job-summary", "train", "--db", db_url, "--json", "--compact"]) == 0
    line = capsys.readouterr().out
    assert line.count("\n") == 1
    assert " " not in line.strip()
    doc = json.loads(line)
    assert (doc["job_id"], doc["gpus"], doc["idle_ratio"], doc["currency"]) == ("train", 2, 0.5, "EUR")
    assert main(["job-summary", "train", "--db", db_url]) == 0
    text = capsys.readouterr().out
    assert "idle:" in text
    assert "50.0% of allocated GPU time" in text
    assert "stalled:     2m30s" in text
    assert main(["job-summary", "serve", "--db", db_url, "--config", str(config), "--json"]) == 0  # running
    running = json.loads(capsys.readouterr().out)
    assert running["ended"] is False
    assert running["cost"] > 0
    assert main(["job-summary", "nope", "--db", db_url]) == 1
    assert "no job 'nope'" in capsys.readouterr().err
