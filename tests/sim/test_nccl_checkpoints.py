"""Checkpoints saved by some ranks alone (``checkpoint_ranks``): NCCL RAS in the simulator shows the writers one
operation behind for the whole save, the others waiting at the same higher count, and every rank equal again once
the save ends; a scenario naming GPUs outside the job, every GPU of it, or no checkpoints is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulens.config import ConfigError
from gpulens.exporter.ncclbusy import BUSY_PCIE_TX_MIN_BYTES_PER_SECOND
from gpulens.exporter.sim import SimCluster, load_scenario, parse_scenario
from gpulens.ncclmodel import is_remote

EXAMPLE = Path(__file__).parents[2] / "examples" / "scenarios" / "nccl-checkpoint.toml"


def _lags(sim: SimCluster, t: float) -> dict[int, int]:
    """Rank -> lag as node-00's agent sees its own ranks (rank 0 writes the checkpoint)."""
    sim.snapshot("node-01", t)
    view = sim.snapshot("node-00", t).nccl
    assert view is not None
    return {r.rank: r.lag or 0 for r in view.ranks if not is_remote(r)}


def test_the_writer_is_one_operation_behind_for_the_whole_save() -> None:
    scenario = load_scenario(EXAMPLE)
    sim = SimCluster(scenario)
    start = scenario.start + 30 * 60  # the first save: 30m to 40m
    during = [_lags(sim, start + 60 * m + 30) for m in range(10)]
    assert all(lags[0] == 1 for lags in during)
    assert all(lag == 0 for lags in during for rank, lag in lags.items() if rank != 0)
    after = [_lags(sim, start + 11 * 60 + 10 * s)[0] for s in range(12)]
    assert 0 in after  # the writer caught up: training again (a transient lag now and then, as any rank)
    assert all(lag <= 2 for lag in after)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('checkpoint_ranks = ["node-01:0"]', "expected some of the job's GPUs"),
        ('checkpoint_ranks = ["node-00:0-7"]', "expected some of the job's GPUs"),
    ],
)
def test_bad_checkpoint_ranks_are_refused(extra: str, message: str) -> None:
    text = EXAMPLE.read_text().replace('checkpoint_ranks = ["node-00:0"]', extra)
    text = text.replace('gpus = ["node-00:0-7", "node-01:0-7"]', 'gpus = ["node-00:0-7"]')
    with pytest.raises(ConfigError, match=message):
        parse_scenario(text, source="bad")


def test_checkpoint_ranks_need_checkpoints() -> None:
    text = EXAMPLE.read_text().replace('checkpoint_every = "30m"\ncheckpoint_duration = "10m"\n', "")
    with pytest.raises(ConfigError, match="needs checkpoint_every"):
        parse_scenario(text, source="bad")


def test_the_writer_is_busy_copying_to_the_host_and_a_deadlocked_rank_is_not() -> None:
    """Through the save node-00's agent judges its rank 0 busy (its GPU sends to the host over PCIe in the save's
    first steps, its process writes and uses a core throughout) and its other ranks not busy. A rank stopped before a
    collective (``hang_spinning``) is behind with its GPU idle and its process doing nothing."""
    scenario = load_scenario(EXAMPLE)
    sim = SimCluster(scenario)
    start = scenario.start + 30 * 60
    for m in range(10):
        snap = sim.snapshot("node-00", start + 60 * m + 30)
        view = snap.nccl
        assert view is not None
        if m >= 1:  # the write phase: the writer's GPU no longer copies, its process's I/O tells
            [gpu0] = [g for g in snap.gpus if g.gpu == 0]
            assert (gpu0.pcie_tx_bytes_per_second or 0.0) < BUSY_PCIE_TX_MIN_BYTES_PER_SECOND
        busy = {r.rank: r.busy for r in view.ranks if not is_remote(r)}
        assert busy[0] is True
        assert {b for rank, b in busy.items() if rank != 0} == {False}
    hang = EXAMPLE.read_text() + (
        '\n[[faults]]\nkind = "hang_spinning"\njob = "pretrain"\nat = "10m"\nduration = "4m"\n'
        'stuck_ranks = ["node-00:0"]\n'
    )
    hung = parse_scenario(hang, source="hang")
    sim = SimCluster(hung)
    view = sim.snapshot("node-00", hung.start + 12 * 60).nccl
    assert view is not None
    [stuck] = [r for r in view.ranks if not is_remote(r) and r.rank == 0]
    assert stuck.lag == 1
    assert stuck.busy is False


def test_a_save_stuck_in_io_never_ends() -> None:
    """``checkpoint_stuck_at``: the first save from then on (minute 60 of the example) never ends: the writer stays
    behind and busy writing to the job's end (minute 75); the saves before it end as usual."""
    text = EXAMPLE.read_text().replace(
        'checkpoint_ranks = ["node-00:0"]', 'checkpoint_ranks = ["node-00:0"]\ncheckpoint_stuck_at = "50m"'
    )
    scenario = parse_scenario(text, source="stuck")
    sim = SimCluster(scenario)
    assert _lags(sim, scenario.start + 45 * 60)[0] <= 2  # the save of minute 30 ended
    for m in (61, 68, 74):
        t = scenario.start + m * 60
        assert _lags(sim, t)[0] == 1
        view = sim.snapshot("node-00", t).nccl
        assert view is not None
        assert {r.rank: r.busy for r in view.ranks if not is_remote(r)}[0] is True


def test_a_stuck_save_needs_checkpoints() -> None:
    text = EXAMPLE.read_text().replace('checkpoint_every = "30m"\ncheckpoint_duration = "10m"\n', "")
    text = text.replace('checkpoint_ranks = ["node-00:0"]\n', 'checkpoint_stuck_at = "50m"\n')
    with pytest.raises(ConfigError, match="needs checkpoint_every"):
        parse_scenario(text, source="bad")
