"""``gpulens demo``: the whole stack on a simulated cluster, as real processes talking HTTP.

It starts one simulated exporter process per node of the scenario, a collector (with the alert engine) writing to
SQLite, and the dashboard; it prints the URLs, shows progress while the stack comes up, and stops every process it
started on Ctrl-C (SIGINT) or SIGTERM. Each process is an ordinary ``gpulens`` command, so what the demo runs is
exactly what an operator deploys.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from gpulens.cli.base import DEMO_CONFIG
from gpulens.config import ConfigError

Announce = Callable[[str], None]
STARTUP_S = 90.0  # how long the processes may take to answer


@dataclass
class DemoOptions:
    scenario: Path | None = None  # default: the bundled demo scenario
    speed: float = 2.0
    db_url: str | None = None
    port: int = 8050  # the dashboard
    host: str = "127.0.0.1"
    workdir: Path = Path(".gpulens-demo")
    webhook_url: str | None = None  # an extra generic-webhook receiver (tests, or your own tool)
    interval_s: float | None = None  # scrape interval; default 10 s of virtual time
    exporter_base_port: int = 0  # 0: free ports


@dataclass
class _Process:
    name: str
    command: list[str]
    ready_url: str | None
    popen: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None


@dataclass
class Demo:
    """The running processes; ``stop()`` ends them all."""

    processes: list[_Process] = field(default_factory=list)
    dashboard_url: str = ""
    exporter_urls: list[str] = field(default_factory=list)
    collector_metrics_url: str = ""

    def pids(self) -> list[int]:
        return [p.popen.pid for p in self.processes if p.popen is not None]

    def failed(self) -> _Process | None:
        return next((p for p in self.processes if p.popen is not None and p.popen.poll() is not None), None)

    def stop(self, timeout_s: float = 20.0) -> None:
        for p in reversed(self.processes):
            if p.popen is not None and p.popen.poll() is None:
                p.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in self.processes:
            if p.popen is None:
                continue
            try:
                p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()


def bundled_scenario() -> Path:
    """The scenario shipped inside the package (4 nodes x 8 H100, a stall a few minutes in)."""
    return Path(str(resources.files("gpulens").joinpath("scenarios/demo.toml")))


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _node_names(scenario: Path) -> list[str]:
    import tomllib

    try:
        data = tomllib.loads(scenario.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the scenario: {exc.strerror or exc}", file=scenario) from None
    except UnicodeDecodeError:
        raise ConfigError("cannot read the scenario: not UTF-8 text (expected a TOML file)", file=scenario) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}", file=scenario) from None
    nodes = data.get("cluster", {}).get("nodes", 0)
    if isinstance(nodes, list):
        return [str(n) for n in nodes]
    if isinstance(nodes, int) and nodes > 0:
        return [f"node-{i:02d}" for i in range(nodes)]
    raise ConfigError("cluster.nodes must be a count or a list of names", file=scenario, key="cluster.nodes")


WEBHOOK_ENV = "GPULENS_DEMO_WEBHOOK_URL"  # the collector reads an extra webhook receiver's URL from here


def _config_text(
    options: DemoOptions, db_url: str, targets: Sequence[str], interval_s: float, for_overrides: Mapping[str, float]
) -> str:
    lines = [
        "# Written by `gpulens demo`; see docs/configuration.md and docs/alerts.md.",
        "[database]",
        f'url = "{db_url}"',
        "",
        "[collector]",
        f'interval = "{interval_s:g}s"',
        f'timeout = "{min(interval_s, 5.0):g}s"',
        f'listen = "{options.host}:{_free_port(options.host)}"',
        f'spool_dir = "{options.workdir / "spool"}"',
        "",
        "[alerts]",
        f'dashboard_url = "http://{options.host}:{options.port}"',
        "",
    ]
    # --speed N runs the scenario N times faster, so the rules' `for` durations shrink with it.
    for name, seconds in sorted(for_overrides.items()):
        lines += [f"[alerts.builtin.{name}]", f'for = "{seconds:g}s"', ""]
    receivers = []
    if os.environ.get("GPULENS_SLACK_WEBHOOK_URL"):
        lines += [
            "[[alerts.receivers]]",
            'name = "slack"',
            'kind = "slack"',
            'url_env = "GPULENS_SLACK_WEBHOOK_URL"',
            "",
        ]
        receivers.append("slack")
    else:
        log_file = options.workdir / "alerts.log"
        lines += ["[[alerts.receivers]]", 'name = "log"', 'kind = "log"', f'path = "{log_file}"', ""]
        receivers.append("log")
    if options.webhook_url:
        lines += ["[[alerts.receivers]]", 'name = "webhook"', 'kind = "webhook"', f'url_env = "{WEBHOOK_ENV}"', ""]
        receivers.append("webhook")
    for name in receivers:
        lines += ["[[alerts.routes]]", f'receiver = "{name}"', 'group_wait = "0s"', 'group_interval = "30s"']
        lines += ["continue = true", ""]  # every receiver gets every alert
    for url in targets:
        lines += ["[[targets]]", f'url = "{url}"', ""]
    return "\n".join(lines)


def _scaled_for(speed: float) -> dict[str, float]:
    """Each builtin rule's `for`, divided by the speed (at least one second)."""
    from gpulens.alerts.rules import builtin_rules

    return {r.name: max(1.0, round(r.for_s / speed, 1)) for r in builtin_rules() if r.for_s > 0 and speed != 1}


def _exited(process: _Process) -> str:
    """Why a process ended during start-up: its last log line first (its own one-line error), then the log's tail."""
    tail = process.log_path.read_text(errors="replace")[-800:] if process.log_path else ""
    last = next((line.strip() for line in reversed(tail.splitlines()) if line.strip()), "no output")
    return f"{process.name} exited during start-up: {last}\n{tail}"


def _wait_ready(demo: Demo, process: _Process, deadline: float) -> None:
    """Until ``process`` answers at its ready URL; raises at once when any process started exits meanwhile."""
    while True:
        failed = demo.failed()
        if failed is not None:
            raise RuntimeError(_exited(failed))
        if process.ready_url is None:
            return
        try:
            with urllib.request.urlopen(process.ready_url, timeout=2) as response:  # noqa: S310 - our own URL
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{process.name} did not become ready at {process.ready_url} in {STARTUP_S:g} s")
        time.sleep(0.25)


def start_demo(options: DemoOptions, announce: Announce) -> Demo:
    """Start every process and wait until each answers. Raises (after stopping what it started) on failure."""
    scenario = (options.scenario or bundled_scenario()).resolve()
    nodes = _node_names(scenario)
    try:
        options.workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(f"{str(options.workdir)!r}: cannot create the directory: {reason}", key="--workdir") from None
    db_url = options.db_url or f"sqlite:///{(options.workdir / 'gpulens.db').resolve()}"
    gpulens = [sys.executable, "-m", "gpulens.cli"]
    demo = Demo()
    exporters = []
    for i, node in enumerate(nodes):
        port = options.exporter_base_port + i if options.exporter_base_port else _free_port(options.host)
        url = f"http://{options.host}:{port}"
        demo.exporter_urls.append(url)
        exporters.append(
            _Process(
                f"exporter {node}",
                [
                    *gpulens,
                    "exporter",
                    "--source",
                    "sim",
                    "--scenario",
                    str(scenario),
                    "--node",
                    node,
                    "--speed",
                    f"{options.speed:g}",
                    "--listen",
                    f"{options.host}:{port}",
                    "--user-names",  # the demo's users show on its jobs and reports pages
                    "--log-level",
                    "warning",
                ],
                f"{url}/healthz",
            )
        )
    interval = options.interval_s or max(1.0, 10.0 / options.speed)
    config = options.workdir / "gpulens.toml"
    overrides = _scaled_for(options.speed)
    config.write_text(_config_text(options, db_url, demo.exporter_urls, interval, overrides), encoding="utf-8")
    collector = _Process("collector", [*gpulens, "collector", "--config", str(config), "--migrate"], None)
    dashboard_url = f"http://{options.host}:{options.port}"
    dashboard = _Process(
        "dashboard",
        [*gpulens, "dashboard", "--config", str(config), "--listen", f"{options.host}:{options.port}"],
        f"{dashboard_url}/healthz",
    )
    demo.dashboard_url = dashboard_url
    demo.processes = [*exporters, collector, dashboard]
    try:
        total = len(demo.processes)
        for n, process in enumerate(demo.processes, start=1):
            process.log_path = options.workdir / f"{process.name.replace(' ', '-')}.log"
            log = process.log_path.open("wb")
            env = dict(os.environ)
            if options.webhook_url:
                env[WEBHOOK_ENV] = options.webhook_url
            process.popen = subprocess.Popen(process.command, stdout=log, stderr=subprocess.STDOUT, env=env)
            log.close()
            if n == len(exporters):
                announce(f"[{n}/{total}] {len(exporters)} simulated exporters started ({', '.join(nodes)})")
            elif n > len(exporters):
                announce(f"[{n}/{total}] starting the {process.name}")
        (options.workdir / "pids").write_text("".join(f"{pid}\n" for pid in demo.pids()), encoding="utf-8")
        deadline = time.monotonic() + STARTUP_S
        for process in demo.processes:
            _wait_ready(demo, process, deadline)
    except BaseException:
        demo.stop()
        raise
    return demo


def run_demo(options: DemoOptions, announce: Announce, stop: threading.Event) -> int:
    """Start the demo, print where to look, and run until ``stop`` is set; then stop every process."""
    announce(f"gpulens demo: {options.scenario or 'the bundled scenario'} at {options.speed:g}x speed")
    demo = start_demo(options, announce)
    announce("")
    announce(f"  dashboard   {demo.dashboard_url}")
    announce(f"  exporters   {demo.exporter_urls[0]}/metrics ... ({len(demo.exporter_urls)} nodes)")
    announce(f"  logs        {options.workdir}/")
    announce(f"  config      {options.workdir / 'gpulens.toml'}")
    announce("")
    config = options.workdir / "gpulens.toml"
    found = " (from this directory it finds it without --config)" if str(config) == DEMO_CONFIG else ""
    announce(f"The CLI reads the demo with: gpulens query latest --config {config}{found}")
    announce("Live data appears within a minute; the stalled training job raises CommunicationStall within a few.")
    announce("Press Ctrl-C to stop.")
    try:
        while not stop.wait(1.0):
            failed = demo.failed()
            if failed is not None:
                announce(f"{failed.name} exited unexpectedly (see {failed.log_path}); stopping the demo")
                return 1
    finally:
        announce("stopping...")
        demo.stop()
        announce("stopped.")
    return 0
