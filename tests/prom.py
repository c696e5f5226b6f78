"""A real Prometheus server (Debian's package) for tests: scrape our endpoints, then ask its HTTP API."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import free_port, http_get


@contextmanager
def running_prometheus(
    binary: str,
    workdir: Path,
    jobs: dict[str, tuple[str, str]],
    *,
    extra: dict[str, dict[str, Any]] | None = None,
    interval_s: float = 1.0,
    flags: Sequence[str] = (),
    rules: Sequence[Path] = (),
) -> Iterator[str]:
    """Start Prometheus scraping ``jobs`` ({job name: (host:port, metrics path)}) every ``interval_s`` (one second);
    yield its base URL.

    ``extra``: more scrape-config keys by job name (``metric_relabel_configs``, ...); ``flags``: more command-line
    flags; ``rules``: rule files to load."""
    config = {
        "global": {"scrape_interval": f"{interval_s * 1000:.0f}ms", "scrape_timeout": f"{interval_s * 900:.0f}ms"},
        "scrape_configs": [
            {
                "job_name": name,
                "metrics_path": path,
                "static_configs": [{"targets": [target]}],
                **(extra or {}).get(name, {}),
            }
            for name, (target, path) in jobs.items()
        ],
        **({"rule_files": [str(r) for r in rules]} if rules else {}),
    }
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = (workdir / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            *flags,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if http_get(f"{base}/-/ready", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("Prometheus did not start:\n" + (workdir / "prometheus.log").read_text()[-2000:])
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def query(base: str, promql: str) -> list[dict[str, Any]]:
    status, _, body = http_get(f"{base}/api/v1/query?query={urllib.parse.quote(promql)}")
    assert status == 200, body
    doc = json.loads(body)
    assert doc["status"] == "success", doc
    result: list[dict[str, Any]] = doc["data"]["result"]
    return result


def wait_for(
    base: str, promql: str, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 60
) -> list[dict[str, Any]]:
    """Poll a query until ``predicate(result)`` holds; fail with the last result."""
    deadline = time.monotonic() + timeout
    result: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        result = query(base, promql)
        if predicate(result):
            return result
        time.sleep(0.5)
    raise AssertionError(f"{promql}: condition not met within {timeout}s; last result {result}")
