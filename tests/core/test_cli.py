"""The CLI as a user meets it: --help with examples, one-line errors with a non-zero status and no traceback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import free_port, http_get

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scenarios"


def gpulens(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpulens.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess[str], status: int, *needles: str) -> None:
    assert result.returncode == status, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_help_shows_examples_and_environment_twins() -> None:
    top = gpulens("--help")
    assert top.returncode == 0
    assert "examples:" in top.stdout
    assert "exporter" in top.stdout
    sub = gpulens("exporter", "--help")
    assert sub.returncode == 0
    assert "examples:" in sub.stdout
    for twin in ("GPULENS_EXPORTER_LISTEN", "GPULENS_EXPORTER_SOURCE", "GPULENS_EXPORTER_WEB_CONFIG"):
        assert twin in sub.stdout


def test_bad_flag_value_is_one_line() -> None:
    assert_one_line_error(gpulens("exporter", "--interval", "soon"), 2, "--interval", "soon")
    assert_one_line_error(gpulens("exporter", "--source", "magic"), 2, "--source")
    assert_one_line_error(gpulens("exporter", "--listen", "nowhere"), 1, "--listen", "host:port")


def test_bad_environment_twin_names_the_variable() -> None:
    result = gpulens("exporter", env={"GPULENS_EXPORTER_INTERVAL": "-5s"})
    assert_one_line_error(result, 2, "GPULENS_EXPORTER_INTERVAL", "--interval")
    result = gpulens("exporter", env={"GPULENS_EXPORTER_DCGM_COMPAT": "maybe"})
    assert_one_line_error(result, 2, "GPULENS_EXPORTER_DCGM_COMPAT")


def test_no_nvml_names_the_alternatives() -> None:
    result = gpulens("exporter", "--listen", f"127.0.0.1:{free_port()}")
    assert_one_line_error(result, 1, "NVML", "--source sim", "--source dcgm")
    assert_one_line_error(gpulens("exporter", "--source", "nvml"), 1, "NVML")


def test_unreadable_web_config() -> None:
    result = gpulens("exporter", "--source", "dcgm", "--web-config", "/nonexistent/web.yml")
    assert_one_line_error(result, 1, "/nonexistent/web.yml", "cannot read")


def test_port_in_use() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = gpulens(
            "exporter", "--source", "dcgm", "--dcgm-url", "http://127.0.0.1:9/metrics", "--listen", f"127.0.0.1:{port}"
        )
    assert_one_line_error(result, 1, f"127.0.0.1:{port}", "in use")


def test_environment_twin_sets_the_flag_and_the_exporter_serves_until_sigterm(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    env.update(
        {
            "GPULENS_EXPORTER_SOURCE": "sim",
            "GPULENS_EXPORTER_SCENARIO": str(EXAMPLES / "healthy.toml"),
            "GPULENS_EXPORTER_LISTEN": f"127.0.0.1:{port}",
            "GPULENS_EXPORTER_NODE": "node-01",
        }
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpulens.cli", "exporter"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        status = None
        while time.monotonic() < deadline and status != 200:
            try:
                status, _, body = http_get(f"http://127.0.0.1:{port}/api/v1/snapshot", timeout=2)
            except OSError:
                time.sleep(0.2)
        assert status == 200
        assert json.loads(body)["node"] == "node-01"
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize("flag", ["--scenario"])
def test_sim_without_a_scenario(flag: str) -> None:
    assert_one_line_error(gpulens("exporter", "--source", "sim"), 1, flag)
