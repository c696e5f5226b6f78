"""The job page opens on the job's own lifetime, not the global range, and shows its accounting summary."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulens.clock import ManualClock
from gpulens.dashboard.components import ViewState
from gpulens.dashboard.context import Context
from gpulens.dashboard.pages import job
from gpulens.dashboard.timerange import CUSTOM, resolve_range
from gpulens.model import GpuJob, NodeSnapshot
from gpulens.settings import Prices
from gpulens.storage.db import Database
from gpulens.storage.writer import Writer
from tests.dashboard.test_pages import text_of
from tests.fakes.static_source import h100

T0 = 1_767_225_600.0  # 2026-01-01T00:00Z


@pytest.fixture
def context(tmp_path: Path) -> Iterator[Context]:
    """An hour of rounds: job "short" holds node-00's GPUs from 00:20:00 to 00:22:00; "serving" runs throughout."""
    clock = ManualClock(T0)
    db = Database(f"sqlite:///{tmp_path / 'gpulens.db'}", clock=clock)
    db.upgrade()
    writer = Writer(db)
    for k in range(0, 3601, 30):
        t = T0 + k
        clock.set(t)
        short = tuple(h100("node-00", i, t) for i in range(2))
        serving = h100("node-01", 0, t)
        serving_job = GpuJob("node-01", 0, serving.uuid, "serving")
        held = 1200 <= k <= 1320
        writer.write(
            [
                NodeSnapshot(
                    "node-00", t, "test", gpus=short,
                    jobs=tuple(GpuJob("node-00", g.gpu, g.uuid, "short", "alice") for g in short) if held else (),
                ),
                NodeSnapshot("node-01", t, "test", gpus=(serving,), jobs=(serving_job,)),
            ]
        )  # fmt: skip
    yield Context(db=db, clock=clock, prices=Prices(per_gpu_hour=2.0, currency="EUR"))
    db.close()


def test_an_ended_job_opens_on_its_own_two_minutes(context: Context) -> None:
    state = job.lifetime_state(context, "short", {})
    assert (state.range, state.start, state.end) == (CUSTOM, "2026-01-01T00:20", "2026-01-01T00:22")
    span = resolve_range(state.range, state.start, state.end, context.clock.now())
    assert (span.start, span.end) == (T0 + 1200, T0 + 1320)  # not the last hour, where it would be a sliver
    assert job.lifetime_state(context, "short", {"range": "6h"}) == ViewState(range="6h")  # the URL's range wins
    assert job.lifetime_state(context, "no-such-job", {}) == ViewState()


def test_a_running_job_opens_from_its_start_to_now(context: Context) -> None:
    state = job.lifetime_state(context, "serving", {})
    assert (state.range, state.start, state.end) == (CUSTOM, "2026-01-01T00:00", "")
    span = resolve_range(state.range, state.start, state.end, context.clock.now())
    assert (span.start, span.end) == (T0, context.clock.now())


def test_the_page_shows_the_jobs_accounting(context: Context) -> None:
    _status, info, charts, *_ = job.render(context, job.lifetime_state(context, "short", {}), "short")
    text = text_of(info)
    assert "Accounting (ended): 0.07 GPU-hours" in text  # 2 GPUs for 2 minutes
    assert "0.13 EUR" in text
    assert charts  # the charts are drawn over the job's range
