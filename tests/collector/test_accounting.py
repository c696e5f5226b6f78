"""The collector summarises ended jobs between rounds (storage.jobsummary), with the config's prices."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpulens.clock import ManualClock
from gpulens.collector.loop import Collector
from gpulens.model import GpuJob, NodeSnapshot
from gpulens.settings import Prices, default_settings
from gpulens.storage import jobsummary
from gpulens.storage.db import Database
from gpulens.storage.writer import Writer
from tests.fakes.static_source import h100

T0 = 1_767_225_600.0


def test_a_job_that_ended_is_summarised_once_between_rounds(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    url = f"sqlite:///{tmp_path / 'c.db'}"
    db = Database(url, clock=clock)
    db.upgrade()
    writer = Writer(db)
    for k in range(8):  # job 99 holds a GPU for 60 s, then leaves it
        t = T0 + 10 * k
        gpu = h100("n1", 0, t)
        writer.write(
            [NodeSnapshot("n1", t, "test", gpus=(gpu,), jobs=(GpuJob("n1", 0, gpu.uuid, "99"),) if k < 7 else ())]
        )
    settings = dataclasses.replace(
        default_settings(environ={}), db_url=url, spool_dir=str(tmp_path / "spool"), prices=Prices(per_gpu_hour=6.0)
    )
    collector = Collector(settings, db, clock=clock)
    try:
        clock.set(T0 + 70)
        collector.run_round()
        assert jobsummary.stored(db, "99") is None  # ended less than ENDED_AFTER_S ago
        clock.set(T0 + 60 + jobsummary.ENDED_AFTER_S + 30)
        collector.run_round()
        account = jobsummary.stored(db, "99")
        assert account is not None
        assert account.gpu_hours == pytest.approx(60 / 3600)
        assert account.cost == pytest.approx(60 / 3600 * 6.0)
    finally:
        collector.close()
        db.close()
