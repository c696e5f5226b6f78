"""User and job names leave the exporter only with ``--user-names``; job ids, accounts and GPUs always do.

The exporter runs in process over the healthy scenario's first node (alice's job holds its GPUs), once as installed
and once with the option, and both ``/metrics`` and the snapshot document are read back.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.cli.main import build_parser
from gpulens.exporter.agent import ExporterOptions, run_exporter
from tests.conftest import http_get
from tests.slurm.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]


def _serve(user_names: bool) -> Iterator[str]:
    options = ExporterOptions(
        source="sim",
        scenario=str(REPO / "examples" / "scenarios" / "healthy.toml"),
        listen="127.0.0.1:0",
        interval_s=0.2,
        fabric=False,
        user_names=user_names,
    )
    announced: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(target=run_exporter, args=(options, announced.append, stop), daemon=True)
    thread.start()
    try:
        wait_for(lambda: announced, "the exporter to announce itself")
        yield announced[0].rsplit(" ", 1)[1].removesuffix("/metrics")
    finally:
        stop.set()
        thread.join(timeout=10)


@pytest.fixture(params=[False, True], ids=["as-installed", "user-names"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[bool, str]]:
    for base in _serve(request.param):
        yield request.param, base


def _job_series(base: str) -> list[dict[str, str]]:
    def read() -> list[dict[str, str]]:
        _, _, body = http_get(base + "/metrics")
        return [
            dict(s.labels)
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples
            if s.name == "gpulens_gpu_job_info"
        ]

    wait_for(read, "the scenario's jobs in /metrics")
    return read()


def test_user_names_are_served_only_when_asked_for(served: tuple[bool, str]) -> None:
    user_names, base = served
    series = _job_series(base)
    users = {s["user"] for s in series}
    _, _, body = http_get(base + "/api/v1/snapshot")
    document = json.loads(body)
    in_document = {j.get("user") for j in document["jobs"]} | {p.get("user") for p in document["processes"]}
    if user_names:
        assert users == {"alice"}  # the first node's job
        assert "alice" in in_document
    else:
        assert users == {""}  # the label stays, empty: the series keep their shape
        assert in_document <= {None}
        assert b"alice" not in body
    assert all(s["job_id"] for s in series)  # the job-to-GPU mapping is whole either way


def test_the_option_has_an_environment_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    assert build_parser().parse_args(["exporter"]).user_names is False
    monkeypatch.setenv("GPULENS_EXPORTER_USER_NAMES", "true")
    assert build_parser().parse_args(["exporter"]).user_names is True
