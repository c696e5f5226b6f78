"""From ``sbatch`` to /metrics: real Slurm jobs, mapped by the real prolog, on a simulated exporter's GPUs.

The exporter simulates node-00 of examples/scenarios/healthy.toml, whose scenario puts job llm-pretrain on all eight
GPUs; the job map written by deploy/slurm/prolog.sh under slurmd overrides it GPU by GPU.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.exporter.agent import ExporterOptions, run_exporter
from tests.conftest import http_get
from tests.slurm.conftest import Slurm, wait_for

REPO = Path(__file__).resolve().parents[2]
SCENARIO_JOB = "llm-pretrain"


class Exporter:
    def __init__(self, base: str) -> None:
        self.base = base

    def samples(self, family: str) -> list[dict[str, str]]:
        status, _, body = http_get(self.base + "/metrics")
        assert status == 200
        return [s.labels for f in text_string_to_metric_families(body.decode()) for s in f.samples if s.name == family]

    def jobs_by_gpu(self) -> dict[int, set[str]]:
        found: dict[int, set[str]] = {}
        for labels in self.samples("gpulens_gpu_job_info"):
            found.setdefault(int(labels["gpu"]), set()).add(labels["job_id"])
        return found

    def gpus_of(self, job: str) -> set[int]:
        return {gpu for gpu, jobs in self.jobs_by_gpu().items() if job in jobs}

    def job_info(self, job: str) -> dict[str, str] | None:
        return next((labels for labels in self.samples("gpulens_job_info") if labels["job_id"] == job), None)

    def snapshot(self) -> dict[str, object]:
        status, _, body = http_get(self.base + "/api/v1/snapshot")
        assert status == 200
        doc: dict[str, object] = json.loads(body)
        return doc


@pytest.fixture
def exporter(slurm: Slurm) -> Iterator[Exporter]:
    options = ExporterOptions(
        source="sim",
        scenario=str(REPO / "examples" / "scenarios" / "healthy.toml"),
        node="node-00",
        node_given=True,
        listen="127.0.0.1:0",
        interval_s=0.2,
        job_map_dir=str(slurm.gpustat),
        job_info="slurm",
        fabric=False,
        user_names=True,  # the site asked for names: the tests read Slurm's job names and users
    )
    announced: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(target=run_exporter, args=(options, announced.append, stop), daemon=True)
    thread.start()
    try:
        wait_for(lambda: announced, "the exporter to announce itself")
        served = Exporter(announced[0].rsplit(" ", 1)[1].removesuffix("/metrics"))
        wait_for(lambda: served.gpus_of(SCENARIO_JOB) == set(range(8)), "the scenario's job on every GPU")
        yield served
    finally:
        stop.set()
        thread.join(timeout=10)


def test_a_gres_job_lands_on_its_gpus_with_its_slurm_name_and_user_and_leaves(slurm: Slurm, exporter: Exporter) -> None:
    job = slurm.sbatch("--gres=gpu:2", "--job-name=trainer", "--account=proj1")
    wait_for(lambda: slurm.state(job) == "RUNNING", f"job {job} to run")
    gpus = slurm.allocated_gpus(job)
    assert len(gpus) == 2
    wait_for(lambda: exporter.gpus_of(job) == gpus, f"job {job} on GPUs {gpus}")
    wait_for(lambda: exporter.job_info(job) is not None, f"Slurm's metadata of job {job}")
    assert exporter.job_info(job) == {
        "job_id": job,
        "name": "trainer",
        "user": "root",
        "account": "proj1",
        "partition": "gpu",
    }
    by_gpu = exporter.jobs_by_gpu()
    assert all(by_gpu[gpu] == {job} for gpu in gpus)  # the job map wins over the scenario on its GPUs
    assert all(by_gpu[gpu] == {SCENARIO_JOB} for gpu in set(range(8)) - gpus)
    users = {s["user"] for s in exporter.samples("gpulens_gpu_job_info") if s["job_id"] == job}
    assert users == {"root"}
    info = next(i for i in exporter.snapshot()["job_info"] if i["job_id"] == job)  # type: ignore[attr-defined]
    assert info["start_time"] is not None
    assert info["submit_time"] <= info["start_time"] <= time.time()

    slurm.run("scancel", job)
    wait_for(lambda: not exporter.gpus_of(job), f"job {job} to leave its GPUs")
    wait_for(lambda: exporter.gpus_of(SCENARIO_JOB) == set(range(8)), "the GPUs back to the scenario")
    assert exporter.job_info(job) is None
    assert not [p for p in slurm.gpustat.iterdir() if not p.name.startswith(".")]  # the epilog cleaned up


def test_array_tasks_and_a_second_job_share_the_node(slurm: Slurm, exporter: Exporter) -> None:
    array = slurm.sbatch("--array=0-1", "--gres=gpu:1", "--job-name=sweep")
    single = slurm.sbatch("--gres=gpu:3", "--job-name=solo")
    wait_for(lambda: slurm.state(array) == slurm.state(single) == "RUNNING", "every job to run")
    tasks = slurm.array_tasks(array)  # once running: a pending task has no job id of its own yet
    assert sorted(tasks) == [0, 1]
    jobs = [*tasks.values(), single]  # each task's own job id, as its prolog saw it
    named = {**{job: f"{array}_{task}" for task, job in tasks.items()}, single: single}  # as squeue names them
    wanted = {job: slurm.allocated_gpus(named[job]) for job in jobs}
    assert sum(len(g) for g in wanted.values()) == len(set().union(*wanted.values())) == 5  # no GPU shared
    wait_for(lambda: all(exporter.gpus_of(j) == g for j, g in wanted.items()), f"every job on its GPUs {wanted}")
    wait_for(lambda: all(exporter.job_info(j) is not None for j in jobs), "Slurm's metadata of every job")
    infos = {i["job_id"]: i for i in exporter.snapshot()["job_info"]}  # type: ignore[attr-defined]
    for task, job in tasks.items():
        assert (infos[job]["name"], infos[job].get("array_job_id"), infos[job].get("array_task_id")) == (
            "sweep",
            array,
            task,
        )
    assert (infos[single]["name"], infos[single].get("array_job_id")) == ("solo", None)


def test_an_index_order_other_than_nvmls_is_mapped_by_uuid(slurm: Slurm, exporter: Exporter) -> None:
    uuids = {int(g["gpu"]): g["uuid"] for g in exporter.snapshot()["gpus"]}  # type: ignore[attr-defined]
    slurm.set_uuids([uuids[7 - i] for i in range(8)])  # Slurm's GPU i is the source's GPU 7 - i
    job = slurm.sbatch("--gres=gpu:2", "--job-name=reversed")
    wait_for(lambda: slurm.state(job) == "RUNNING", f"job {job} to run")
    expected = {7 - i for i in slurm.allocated_gpus(job)}
    wait_for(lambda: exporter.gpus_of(job) == expected, f"job {job} on the source's GPUs {expected}")
    names = {p.name for p in slurm.gpustat.iterdir()}
    assert {uuids[gpu] for gpu in expected} <= names  # the prolog wrote the UUID files ...
    assert {str(7 - gpu) for gpu in expected} <= names  # ... and the index files, which the mapper does not read
    assert exporter.gpus_of(job) == expected
