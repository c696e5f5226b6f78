"""Slurm job metadata: squeue --json parsed, cached off the collection path, failures counted and retried."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from gpulens.clock import ManualClock
from gpulens.exporter.slurmjobs import (
    MAX_OUTPUT_BYTES,
    SQUEUE_MALFORMED,
    SQUEUE_TIMEOUT,
    SlurmJobInfo,
    SlurmQueryError,
    parse_squeue_json,
)
from gpulens.model import GpuJob, NodeSnapshot
from gpulens.promtext import DEFAULT_LIMITS

JOB_2205 = {
    "job_id": 41,
    "name": "trainer",
    "user_name": "alice",
    "account": "proj1",
    "partition": "gpu",
    "array_job_id": 40,
    "array_task_id": 1,
    "submit_time": 1000,
    "start_time": 1010,
}
JOB_2302 = {  # Slurm 23.02+ wraps numbers
    "job_id": 42,
    "name": "solo",
    "user_name": "bob",
    "account": "",
    "partition": "gpu",
    "array_job_id": {"set": True, "infinite": False, "number": 0},
    "array_task_id": {"set": False, "infinite": False, "number": 0},
    "submit_time": {"set": True, "infinite": False, "number": 1000},
    "start_time": {"set": True, "infinite": False, "number": 0},
}


def snapshot(*job_ids: str) -> NodeSnapshot:
    jobs = tuple(GpuJob("n1", i, f"GPU-{i}", job) for i, job in enumerate(job_ids))
    return NodeSnapshot(node="n1", timestamp=0.0, source="sim", jobs=jobs)


class Squeue:
    def __init__(self, *jobs: dict[str, object]) -> None:
        self.body = json.dumps({"jobs": list(jobs)}).encode()
        self.calls: list[list[str]] = []
        self.fail: SlurmQueryError | None = None

    def __call__(self, argv: Sequence[str], timeout_s: float) -> bytes:
        self.calls.append(list(argv))
        if self.fail is not None:
            raise self.fail
        return self.body


def test_both_json_shapes_are_read() -> None:
    found = parse_squeue_json(json.dumps({"jobs": [JOB_2205, JOB_2302]}).encode(), "n1")
    assert (found["41"].name, found["41"].user, found["41"].account, found["41"].partition) == (
        "trainer",
        "alice",
        "proj1",
        "gpu",
    )
    assert (found["41"].array_job_id, found["41"].array_task_id, found["41"].start_time) == ("40", 1, 1010.0)
    assert (found["42"].account, found["42"].array_job_id, found["42"].array_task_id) == (None, None, None)
    assert (found["42"].submit_time, found["42"].start_time) == (1000.0, None)


def test_a_collection_reads_only_the_cache_and_the_worker_fills_it() -> None:
    squeue, clock = Squeue(JOB_2205, JOB_2302), ManualClock(0.0)
    info = SlurmJobInfo(run=squeue, clock=clock.monotonic, worker=False)
    first = info.enrich(snapshot("41", "pod/abc"))
    assert first.job_info == ()
    assert squeue.calls == []
    info.refresh()
    assert squeue.calls == [["squeue", "--json", "--jobs=41"]]  # never a non-Slurm id
    second = info.enrich(snapshot("41", "pod/abc"))
    assert [(i.job_id, i.name, i.node) for i in second.job_info] == [("41", "trainer", "n1")]
    assert second.jobs[0].user == "alice"  # the GPU's job takes Slurm's user where the job map had none
    info.refresh()
    assert len(squeue.calls) == 1  # cached: not asked again before refresh_s


def test_a_failing_squeue_is_counted_and_retried_after_retry_s() -> None:
    squeue, clock = Squeue(JOB_2205), ManualClock(0.0)
    info = SlurmJobInfo(run=squeue, clock=clock.monotonic, worker=False, retry_s=30.0)
    squeue.fail = SlurmQueryError(SQUEUE_TIMEOUT, "squeue did not answer within 10 s")
    info.enrich(snapshot("41"))
    info.refresh()
    assert info.enrich(snapshot("41")).errors == {SQUEUE_TIMEOUT: 1}
    info.refresh()
    assert len(squeue.calls) == 1  # not before retry_s
    squeue.fail = None
    clock.advance(30.0)
    info.enrich(snapshot("41"))
    info.refresh()
    assert [i.name for i in info.enrich(snapshot("41")).job_info] == ["trainer"]


def test_malformed_output_is_one_counted_reason() -> None:
    squeue = Squeue()
    squeue.body = b"squeue: error: not json"
    info = SlurmJobInfo(run=squeue, clock=ManualClock(0.0).monotonic, worker=False)
    info.enrich(snapshot("41"))
    info.refresh()
    assert info.errors == {SQUEUE_MALFORMED: 1}


def test_the_cache_is_bounded() -> None:
    jobs = [dict(JOB_2205, job_id=i) for i in range(1, 11)]
    squeue, clock = Squeue(*jobs), ManualClock(0.0)
    info = SlurmJobInfo(run=squeue, clock=clock.monotonic, worker=False, max_jobs=4)
    info.enrich(snapshot(*(str(i) for i in range(1, 11))))
    info.refresh()
    assert len(info.enrich(snapshot(*(str(i) for i in range(1, 11)))).job_info) == 4


def test_numbers_past_a_float_are_malformed_fields_and_squeue_runs_again_only_after_retry_s() -> None:
    squeue, clock = Squeue(), ManualClock(0.0)
    squeue.body = b'{"jobs": [{"job_id": 41, "name": "x", "submit_time": 1e400, "start_time": -1e400}]}'
    info = SlurmJobInfo(run=squeue, clock=clock.monotonic, worker=False, retry_s=30.0)
    for _ in range(10):  # ten collections within 30 s
        info.enrich(snapshot("41"))
        info.refresh()
        clock.advance(2.0)
    assert len(squeue.calls) == 1
    found = info.enrich(snapshot("41")).job_info
    assert [(i.job_id, i.submit_time, i.start_time) for i in found] == [("41", None, None)]
    squeue.body = b'{"jobs": [{"job_id": 1e400}]}' + b"[" * 100_000
    clock.advance(30.0)
    info.enrich(snapshot("42"))
    info.refresh()
    assert info.errors == {SQUEUE_MALFORMED: 1}


def test_job_names_are_cut_to_the_label_value_length_the_collector_accepts() -> None:
    job = {**JOB_2205, "name": "n" * 200_000, "user_name": "u" * 5000}
    found = parse_squeue_json(json.dumps({"jobs": [job]}).encode(), "n1")["41"]
    assert (len(found.name or ""), len(found.user or "")) == (DEFAULT_LIMITS.label_value_length,) * 2


ENDLESS_SQUEUE = """#!/bin/sh
printf '{"jobs": ['
exec yes '{"job_id": 1, "name": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"},'
"""
# A process that reads metadata through the real runner with the fake squeue first on PATH, and prints its counts,
# its queries and its peak resident memory in kB (VmHWM: this program's own; getrusage's ru_maxrss would start from
# the forking pytest's, which Linux keeps across exec).
READER = """
import re
from pathlib import Path
from gpulens.exporter.slurmjobs import SlurmJobInfo
from gpulens.model import GpuJob, NodeSnapshot
from gpulens.promtext import DEFAULT_LIMITS
info = SlurmJobInfo(worker=False, timeout_s=120.0)
info.enrich(NodeSnapshot(node="n1", timestamp=0.0, source="sim", jobs=(GpuJob("n1", 0, "GPU-0", "41"),)))
info.refresh()
peak = re.search(r"VmHWM:\\s+(\\d+) kB", Path("/proc/self/status").read_text()).group(1)
print(dict(info.errors), info.queries, peak)
"""


def test_a_squeue_that_prints_without_end_is_cut_as_it_streams(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(ENDLESS_SQUEUE)
    (bin_dir / "squeue").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run([sys.executable, "-c", READER], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    errors, queries, peak_kb = done.stdout.split("}")[0] + "}", *done.stdout.split("}")[1].split()
    assert errors == f"{{'{SQUEUE_MALFORMED}': 1}}"
    assert int(queries) == 1
    assert int(peak_kb) < 100 * 1024  # under 100 MB, while squeue would print without end (1.5 GiB and more)
    assert int(peak_kb) > MAX_OUTPUT_BYTES // 1024  # it did read up to the cap
