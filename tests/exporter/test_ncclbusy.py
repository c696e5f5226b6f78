"""A rank is busy (a checkpoint writer) when its GPU copies to the host, or its process writes storage or uses CPU:
the process's ``io`` and ``stat`` read from a fake ``/proc`` (the hardware edge), as rates between two collections,
and the node agent's reader judging its own ranks from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulens.clock import ManualClock
from gpulens.exporter.ncclbusy import RankActivity, judge
from gpulens.exporter.ncclproc import MALFORMED, UNREADABLE, ProcessActivity
from gpulens.exporter.ncclras import NcclRasReader
from gpulens.exporter.sim.rasserver import RasServer
from tests.exporter.test_ncclras_client import _job_state, _snapshot

GB = 10**9


def _proc(
    root: Path, pid: int, *, read: int = 0, written: int = 0, ticks: int = 0, start: int = 777, io: bool = True
) -> None:
    """``/proc/<pid>/stat`` and ``io`` as the kernel writes them (a comm with a space and a parenthesis)."""
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    after = ["S", "1", "1", "1", "0", "-1", "4194304", "10", "0", "0", "0", str(ticks // 2), str(ticks - ticks // 2)]
    after += ["0", "0", "20", "0", "12", "0", str(start), "1000000"]
    (d / "stat").write_text(f"{pid} (pt main) x) {' '.join(after)}\n")
    if io:
        (d / "io").write_text(
            f"rchar: 999999999\nwchar: 888888888\nsyscr: 1\nsyscw: 2\nread_bytes: {read}\nwrite_bytes: {written}\n"
            "cancelled_write_bytes: 0\n"
        )


def test_rates_between_two_readings_of_the_same_process(tmp_path: Path) -> None:
    activity = ProcessActivity(tmp_path, ticks_per_second=100)
    _proc(tmp_path, 41, written=5 * GB, ticks=1000)
    _proc(tmp_path, 42, ticks=1000)
    assert activity.read([41, 42, 43], 100.0) == {41: RankActivity(), 42: RankActivity()}  # no rate yet; 43 gone
    _proc(tmp_path, 41, read=GB, written=9 * GB, ticks=2000)  # 5 GB in 10 s; 10 s of CPU in 10 s
    _proc(tmp_path, 42, ticks=1010)  # asleep: 0.1 s of CPU
    out = activity.read([41, 42], 110.0)
    assert out[41] == RankActivity(io_bytes_per_second=0.5 * GB, cpu_cores=1.0)
    assert out[42] == RankActivity(io_bytes_per_second=0.0, cpu_cores=pytest.approx(0.01))
    _proc(tmp_path, 41, written=GB, ticks=5, start=900)  # a new process of the same pid: no rate from the old one
    assert activity.read([41], 120.0) == {41: RankActivity()}
    assert not activity.errors.snapshot()


def test_an_unreadable_or_malformed_file_is_counted_and_survived(tmp_path: Path) -> None:
    activity = ProcessActivity(tmp_path, ticks_per_second=100)
    _proc(tmp_path, 7, ticks=10)
    (tmp_path / "7" / "io").unlink()
    (tmp_path / "7" / "io").mkdir()  # reading it fails as a permission error would: an OSError
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "stat").write_text("8 (x) S 1\n")
    activity.read([7, 8], 0.0)
    _proc(tmp_path, 7, ticks=1010, io=False)
    out = activity.read([7, 8], 10.0)
    assert out[7] == RankActivity(io_bytes_per_second=None, cpu_cores=1.0)  # io unreadable, CPU still read
    assert 8 not in out
    assert activity.errors[UNREADABLE] == 2
    assert activity.errors[MALFORMED] == 2


@pytest.mark.parametrize(
    ("tx", "activity", "busy"),
    [
        (None, None, None),  # nothing read: not judged
        (1e6, None, False),  # an idle GPU, nothing known of its process
        (1e9, None, True),  # its GPU copies to the host
        (1e6, RankActivity(400e6, 0.1), True),  # its process writes the checkpoint, the GPU idle
        (None, RankActivity(0.0, 1.0), True),  # its process serialises the state
        (1e6, RankActivity(1e5, 0.02), False),  # a dead lock: a few log lines, a watchdog thread
        (None, RankActivity(), None),  # a process's first reading: no rate yet
    ],
)
def test_busy_when_any_reading_says_so(tx: float | None, activity: RankActivity | None, busy: bool | None) -> None:
    assert judge(tx, activity) is busy


def test_the_reader_judges_its_ranks_from_their_processes(tmp_path: Path) -> None:
    """Node b's ranks 8-15 run as pids 5008-5015; rank 9 is behind. Its process writes 4 GB in 10 s: busy. Rank 10's
    process sleeps: not busy. The others have no ``/proc`` entry and their GPUs no PCIe reading: not judged."""
    server = RasServer(lambda: _job_state("2.28.7", lagging=9))
    clock = ManualClock(1000.0)
    reader = NcclRasReader(server.addr, clock=clock, background=False, proc_root=str(tmp_path))
    _proc(tmp_path, 5009, written=GB, ticks=100)
    _proc(tmp_path, 5010, ticks=100)
    try:
        reader.enrich(_snapshot("node-b", 8))
        clock.advance(10.0)
        _proc(tmp_path, 5009, written=5 * GB, ticks=150)
        _proc(tmp_path, 5010, ticks=101)
        snap = reader.enrich(_snapshot("node-b", 8))
    finally:
        server.close()
    assert snap.nccl is not None
    busy = {r.rank: r.busy for r in snap.nccl.ranks}
    assert busy[9] is True
    assert busy[10] is False
    assert {busy[r] for r in busy if r not in (9, 10)} == {None}
    assert "nccl_proc_unreadable" not in snap.errors
