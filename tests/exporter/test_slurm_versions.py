"""The Slurm readers against each release's output (tests/fixtures/slurm, written from the published formats of
22.05 to 24.11): ``squeue --json`` (the exporter's job metadata) and sinfo's node list (the remediation actions')."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpulens.alerts.slurmnodes import parse_sinfo, refuse_name
from gpulens.exporter.slurmjobs import parse_squeue_json

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
VERSIONS = ("22.05", "23.02", "23.11", "24.05", "24.11")


def test_every_release_has_its_fixtures() -> None:
    assert sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) == list(VERSIONS)


@pytest.mark.parametrize("version", VERSIONS)
def test_squeue_json_reads_the_same_jobs_in_every_release(version: str) -> None:
    found = parse_squeue_json((FIXTURES / version / "squeue.json").read_bytes(), "gpu-01")
    got = {
        job_id: (i.name, i.user, i.account, i.partition, i.array_job_id, i.array_task_id, i.submit_time, i.start_time)
        for job_id, i in found.items()
    }
    assert got == {
        "41": ("trainer", "alice", "proj1", "gpu", "40", 1, 1796299000.0, 1796299100.0),
        "42": ("solo", "bob", None, "gpu", None, None, 1796299200.0, 1796299300.0),
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_sinfo_reads_states_reasons_and_features_in_every_release(version: str) -> None:
    nodes = parse_sinfo((FIXTURES / version / "sinfo.txt").read_text())
    seen = {name: (n.drained, n.down, n.ours) for name, n in nodes.items()}
    assert {k: seen[k] for k in ("gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05", "gpu-06", "gpu-07", "gpu-08")} == {
        "gpu-01": (False, False, False),
        "gpu-02": (True, False, True),
        "gpu-03": (True, False, False),  # drained by someone else
        "gpu-04": (False, True, False),
        "gpu-05": (True, False, True),
        "gpu-06": (False, False, False),
        "gpu-07": (True, False, True),
        "gpu-08": (False, False, False),
    }
    assert nodes["gpu-03"].reason == "maintenance"
    assert "gpulens-keep" in nodes["gpu-05"].features
    assert nodes["gpu-08"].features == frozenset()
    assert all(not n.drained and not n.down for name, n in nodes.items() if name in ("gpu-09", "gpu-10", "gpu-11"))
    assert refuse_name("gpu-01", nodes) == ""
    assert refuse_name("gpu-[01-08]", nodes) != ""
