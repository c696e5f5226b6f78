"""Serving a simulated 1,000-node x 8-GPU cluster from one `--all-nodes` exporter process: one round fetches every
node's /node/<name>/api/v1/snapshot (gzip) over HTTP keep-alive from 16 client threads in another process (the
collector's access pattern). Target (issue 3): the round completes within 2 s on this machine.
`cold` is the first round after start (the simulator also builds its per-job state); `new_step` is a round just
after the simulation moved to its next 10 s step, so every node's snapshot is computed and rendered again (what a
collector scraping every 10 s meets in steady state); `cached` is another round within that same step.
"""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import options
from bench.bench_sim import scenario_text

THREADS = 16
STEP_S = 10.0  # the scenario's step at --speed 1


def fetch_round(port: int, names: list[str]) -> tuple[float, int]:
    local = threading.local()

    def get(name: str) -> int:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", f"/node/{name}/api/v1/snapshot", headers={"Accept-Encoding": "gzip"})
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"{name}: HTTP {response.status}")
        return len(body)

    started = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        sizes = list(pool.map(get, names))
    return time.perf_counter() - started, sum(sizes)


def wait_ready(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError("the exporter did not start")


def main() -> None:
    options.no_arguments(__spec__.name if __spec__ else __name__, __doc__)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.toml"
        path.write_text(scenario_text())
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "gpulens.cli",
            "exporter",
            "--source",
            "sim",
            "--scenario",
            str(path),
            "--all-nodes",
            "--listen",
            f"127.0.0.1:{port}",
            "--speed",
            "1",
            "--log-level",
            "warning",
        ]
        proc = subprocess.Popen(command)
        try:
            wait_ready(port)
            names = [f"node-{i:03d}" for i in range(1000)]
            cold, _ = fetch_round(port, names)
            time.sleep(max(0.0, next_step(port) - time.time()) + 0.05)
            new_step, size = fetch_round(port, names)
            cached, _ = fetch_round(port, names)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
    print(f"sim_serve_round_1000x8_cold: {cold:.2f} s")
    print(f"sim_serve_round_1000x8_new_step: {new_step:.2f} s")
    print(f"sim_serve_round_1000x8_cached: {cached:.2f} s")
    print(f"sim_serve_round_bytes_gzip: {size / 1e6:.1f} MB")


def next_step(port: int) -> float:
    """The wall-clock time at which the simulation enters its next step (readings carry their step's start)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/node/node-000/api/v1/snapshot")
    started = float(json.loads(conn.getresponse().read())["time"])
    return started + STEP_S


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    main()
