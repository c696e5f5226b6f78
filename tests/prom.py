"""Real Prometheus and VictoriaMetrics servers (Debian's packages) for tests: scrape our endpoints, then ask their
HTTP API (the same Prometheus query API)."""

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


def scrape_config(
    jobs: dict[str, tuple[str, str]], extra: dict[str, dict[str, Any]] | None, interval_s: float
) -> dict[str, Any]:
    """A Prometheus scrape configuration (which VictoriaMetrics reads too) of ``jobs`` ({job name: (host:port,
    metrics path)}) every ``interval_s``; ``extra``: more scrape-config keys by job name."""
    return {
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
    }


@contextmanager
def serving(command: list[str], base: str, ready: str, log_path: Path, what: str) -> Iterator[str]:
    """Run ``command`` (its output in ``log_path``) until ``base + ready`` answers 200; yield ``base``; stop it."""
    log = log_path.open("wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if http_get(base + ready, timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start:\n" + log_path.read_text()[-2000:])
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
    config_path = workdir / "prometheus.yml"
    config = scrape_config(jobs, extra, interval_s)
    if rules:
        config["rule_files"] = [str(r) for r in rules]
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    command = [
        binary,
        f"--config.file={config_path}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        *flags,
    ]
    with serving(command, f"http://127.0.0.1:{port}", "/-/ready", workdir / "prometheus.log", "Prometheus") as base:
        yield base


@contextmanager
def running_victoriametrics(
    binary: str,
    workdir: Path,
    jobs: dict[str, tuple[str, str]],
    *,
    extra: dict[str, dict[str, Any]] | None = None,
    interval_s: float = 1.0,
    flags: Sequence[str] = ("-search.latencyOffset=1s",),
    memory: str | None = "512MB",
) -> Iterator[str]:
    """Start VictoriaMetrics (single node, Debian's package) scraping ``jobs`` itself (``-promscrape.config``: the
    Prometheus scrape configuration ``running_prometheus`` writes) every ``interval_s``; yield its base URL, the
    prefix of its Prometheus query API. ``flags``: more command-line flags; by default ``-search.latencyOffset=1s``
    (as docs/victoriametrics.md advises: a range query's points of the last 30 s repeat the point before, and a
    store younger than that answers none), ``()`` for VictoriaMetrics's defaults. ``memory``: what its caches may
    take (``-memory.allowedBytes``; None: VictoriaMetrics's default, 60 % of the machine's memory)."""
    config_path = workdir / "scrape.yml"
    config_path.write_text(yaml.safe_dump(scrape_config(jobs, extra, interval_s)))
    port = free_port()
    command = [
        binary,
        f"-storageDataPath={workdir / 'vmdata'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        f"-promscrape.config={config_path}",
        "-loggerLevel=WARN",
        *([f"-memory.allowedBytes={memory}"] if memory else []),
        *flags,
    ]
    log = workdir / "victoria-metrics.log"
    with serving(command, f"http://127.0.0.1:{port}", "/health", log, "VictoriaMetrics") as base:
        yield base


def vmalert_command(binary: str, base: str, rules: Path, *flags: str) -> list[str]:
    """vmalert evaluating the rule file ``rules`` against the VictoriaMetrics at ``base`` and writing the recorded
    series back into it (remote write): as docs/victoriametrics.md runs it. ``-datasource.queryStep=0``: a rule is
    queried with its group's interval as the step (vmalert's default, 5 m, makes a replay evaluate every 5 m only)."""
    return [
        binary,
        f"-rule={rules}",
        f"-datasource.url={base}",
        f"-remoteWrite.url={base}",
        "-datasource.queryStep=0",
        "-loggerLevel=WARN",
        *flags,
    ]


@contextmanager
def running_vmalert(binary: str, workdir: Path, base: str, rules: Path, flags: Sequence[str] = ()) -> Iterator[str]:
    """Start vmalert evaluating ``rules`` against the VictoriaMetrics at ``base`` (recorded series written back every
    second); yield vmalert's own base URL."""
    port = free_port()
    command = vmalert_command(
        binary, base, rules, f"-httpListenAddr=127.0.0.1:{port}", "-remoteWrite.flushInterval=1s", *flags
    )
    with serving(command, f"http://127.0.0.1:{port}", "/health", workdir / "vmalert.log", "vmalert") as own:
        yield own


def replay_rules(binary: str, base: str, rules: Path, start: float, end: float) -> None:
    """Evaluate ``rules`` over [start, end] at their groups' intervals against the VictoriaMetrics at ``base`` and
    write the recorded series into it (vmalert's replay mode), then make them searchable."""
    import datetime

    def iso(t: float) -> str:
        return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    done = subprocess.run(
        vmalert_command(
            binary,
            base,
            rules,
            f"-replay.timeFrom={iso(start)}",
            f"-replay.timeTo={iso(end)}",
            "-replay.disableProgressBar",
            "-replay.rulesDelay=0",  # no rule reads another's output
        ),
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"vmalert replay failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    force_flush(base)


def force_flush(base: str) -> None:
    """Make what VictoriaMetrics at ``base`` was sent searchable now."""
    status, _, body = http_get(f"{base}/internal/force_flush", timeout=600)
    assert status == 200, body


def query(base: str, promql: str) -> list[dict[str, Any]]:
    # nocache=1: VictoriaMetrics answers now, not as of -search.latencyOffset (30 s) ago (Prometheus ignores it)
    status, _, body = http_get(f"{base}/api/v1/query?query={urllib.parse.quote(promql)}&nocache=1")
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
