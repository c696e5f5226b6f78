"""A live stack for the Prometheus backend tests: simulated exporters (gpulens format and ``--dcgm-compat``) from a
stall scenario, real Prometheus (or VictoriaMetrics) servers scraping them, a collector writing SQLite, ``gpulens
alerts run`` over each server, and a local webhook receiver.

Prometheus ``gl`` scrapes the gpulens families of the stall exporter and of a frozen exporter (``--speed 0.001``:
its readings do not change during the test, so the SQL path and Prometheus must agree on every value); Prometheus
``dcgm`` scrapes the ``--dcgm-compat`` exporter keeping only the dcgm-exporter families and adding dcgm-exporter's
``hpc_job`` label, as a dcgm-exporter with HPC job mapping would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

from tests.conftest import free_port, http_get
from tests.prom import running_prometheus, wait_for

NODES = ("node-00", "node-01")
FROZEN_NODES = ("eq-00", "eq-01")
SPEED = 10  # the stall begins 6 virtual minutes in: 36 s after the exporters start
SCENARIO = """
[cluster]
nodes = {nodes}
gpus_per_node = 4
gpu_model = "H100-SXM5-80GB"
seed = {seed}
start = "2026-01-01T00:00:00Z"
duration = "300m"
step = "10s"

[[jobs]]
id = "{job}"
user = "alice"
kind = "training"
gpus = ["{a}:0-3", "{b}:0-3"]
memory_fraction = 0.85

[[faults]]
kind = "comm_stall"
job = "{job}"
at = "6m"
duration = "200m"
"""
ALERTS_CONFIG = """
[database]
min_step = "1s"
state_url = "sqlite:///{state}"

[alerts.builtin.CommunicationStall]
for = "3s"

[[alerts.receivers]]
name = "hook"
kind = "webhook"
url_env = "HOOK_URL"

[[alerts.routes]]
receiver = "hook"
group_wait = "0s"
"""


class Hook(BaseHTTPRequestHandler):
    payloads: ClassVar[dict[str, list[dict[str, Any]]]] = {}

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        Hook.payloads.setdefault(self.path, []).append(json.loads(body))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


def fired(path: str, rule: str) -> list[dict[str, Any]]:
    """The firing alerts of ``rule`` delivered to the receiver at ``path``."""
    return [
        alert
        for payload in Hook.payloads.get(path, [])
        for alert in payload["alerts"]
        if alert["labels"].get("alertname") == rule and alert["status"] == "firing"
    ]


def gpulens(*args: str, env: dict[str, str] | None = None, log: Path) -> subprocess.Popen[bytes]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    with log.open("wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "gpulens.cli", *args],
            env={**base, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def run_gpulens(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    return subprocess.run(
        [sys.executable, "-m", "gpulens.cli", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@contextmanager
def process(proc: subprocess.Popen[bytes], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.returncode not in (0, -15):
            print(log.read_text()[-3000:])


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if http_get(url, timeout=2)[0] == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{url} did not answer:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


@dataclass
class Stack:
    root: Path
    prom_gl: str  # base URLs (http://...)
    prom_dcgm: str
    sql_url: str  # the collector's SQLite store, scraping the frozen exporter
    hook: str  # the receiver's base URL
    config_gl: Path
    config_dcgm: Path
    engines: dict[str, tuple[subprocess.Popen[bytes], Path]] = field(default_factory=dict)  # by source: (process, log)

    def engine_report(self, source: str) -> str:
        """What the ``source`` engine was doing: every thread's stack (faulthandler, on SIGABRT, which ends it) and
        its log's tail, rounds' durations included."""
        proc, log = self.engines[source]
        if proc.poll() is None:
            proc.send_signal(signal.SIGABRT)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        return log.read_text(errors="replace")[-8000:]


def _exporter(root: Path, name: str, scenario: str, speed: float, port: int, *extra: str) -> subprocess.Popen[bytes]:
    path = root / f"{name}.toml"
    path.write_text(scenario)
    return gpulens(
        "exporter", "--source", "sim", "--scenario", str(path), "--all-nodes", "--speed", f"{speed:g}",
        "--listen", f"127.0.0.1:{port}", *extra, log=root / f"{name}.log",
    )  # fmt: skip


def _serving(stack: ExitStack, root: Path, name: str, proc: subprocess.Popen[bytes], port: int) -> None:
    stack.enter_context(process(proc, root / f"{name}.log"))
    wait_http(f"http://127.0.0.1:{port}/api/v1/nodes", proc, root / f"{name}.log")


@contextmanager
def running_stack(
    root: Path, prometheus: str, store: Callable[..., AbstractContextManager[str]] = running_prometheus
) -> Iterator[Stack]:
    """The stack, its two stores run by ``store`` (``running_prometheus`` or ``running_victoriametrics``) from the
    binary ``prometheus``."""
    Hook.payloads = {}
    with ExitStack() as stack:
        server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        stack.callback(server.server_close)
        stack.callback(server.shutdown)
        hook = f"http://127.0.0.1:{server.server_address[1]}"
        a, b = NODES
        stall = SCENARIO.format(nodes=list(NODES), seed=7, a=a, b=b, job="llm-pretrain").replace("'", '"')
        frozen = SCENARIO.format(nodes=list(FROZEN_NODES), seed=11, a="eq-00", b="eq-01", job="frozen-train").replace(
            "'", '"'
        )
        gl_port, dcgm_port, frozen_port = free_port(), free_port(), free_port()
        assert len({gl_port, dcgm_port, frozen_port}) == 3
        _serving(stack, root, "frozen", _exporter(root, "frozen", frozen, 0.001, frozen_port), frozen_port)
        jobs_gl = {n: (f"127.0.0.1:{gl_port}", f"/node/{n}/metrics") for n in NODES}
        jobs_gl |= {n: (f"127.0.0.1:{frozen_port}", f"/node/{n}/metrics") for n in FROZEN_NODES}
        jobs_dcgm = {n: (f"127.0.0.1:{dcgm_port}", f"/node/{n}/metrics") for n in NODES}
        dcgm_only = {
            "metric_relabel_configs": [
                {"source_labels": ["__name__"], "regex": "gpulens_.*", "action": "drop"},
                {"target_label": "hpc_job", "replacement": "llm-pretrain"},
            ]
        }
        (root / "p-gl").mkdir()
        (root / "p-dcgm").mkdir()
        prom_gl = stack.enter_context(store(prometheus, root / "p-gl", jobs_gl))
        prom_dcgm = stack.enter_context(
            store(prometheus, root / "p-dcgm", jobs_dcgm, extra=dict.fromkeys(jobs_dcgm, dcgm_only))
        )
        configs = {}
        engines = {}
        for name in ("gl", "dcgm"):
            configs[name] = root / f"alerts-{name}.toml"
            configs[name].write_text(ALERTS_CONFIG.format(state=root / f"state-{name}.db"))
            log = root / f"alerts-{name}.log"
            prom = prom_gl if name == "gl" else prom_dcgm
            proc = gpulens(
                "alerts", "run", "--db", "prometheus+" + prom, "--config", str(configs[name]), "--interval", "1s",
                "--log-level", "debug", env={"HOOK_URL": f"{hook}/{name}", "PYTHONFAULTHANDLER": "1"}, log=log,
            )  # fmt: skip
            stack.enter_context(process(proc, log))
            engines[name] = (proc, log)
        # The stalled exporters start last, their clocks with them: the engines already run, so each has the whole
        # 36 s before the stall to learn the job's baseline (6 rounds of normal work; started after the exporters,
        # an engine on a loaded machine once had too few, held its judgement and never fired).
        stalled = {
            "gl": (_exporter(root, "gl", stall, SPEED, gl_port, "--process-pids"), gl_port),  # the frozen: no pids
            "dcgm": (_exporter(root, "dcgm", stall, SPEED, dcgm_port, "--dcgm-compat"), dcgm_port),
        }
        for name, (proc, port) in stalled.items():
            _serving(stack, root, name, proc, port)
        sql_url = f"sqlite:///{root / 'sql.db'}"
        log = root / "collector.log"
        targets = [arg for n in FROZEN_NODES for arg in ("--target", f"http://127.0.0.1:{frozen_port}/node/{n}")]
        proc = gpulens(
            "collector", "--db", sql_url, *targets, "--interval", "1s", "--listen", f"127.0.0.1:{free_port()}",
            "--spool-dir", str(root / "spool"), log=log,
        )  # fmt: skip
        stack.enter_context(process(proc, log))
        yield Stack(root, prom_gl, prom_dcgm, sql_url, hook, configs["gl"], configs["dcgm"], engines)


def wait_for_scrapes(stack: Stack, samples: int = 5) -> None:
    """Wait until the store holds ``samples`` scrapes of every GPU's energy counter in the last 20 s: a counter's
    rate needs two samples in its window, and in CI a test once read a range that held a single scrape of some GPUs
    (the store answered as soon as it held one)."""
    wait_for(
        stack.prom_gl,
        f"count(count_over_time(gpulens_gpu_energy_joules_total[20s]) >= {samples})",
        lambda r: bool(r) and r[0]["value"][1] == "16",
    )
