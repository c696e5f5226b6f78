"""Side by side: gpulens's exporter against nvitop-exporter (PyPI) on the same fake NVML, in one run.

Each tool runs in its own process, started through its own entry point (``gpulens.exporter.agent.run_exporter``,
``nvitop_exporter.cli.main``), after the same injection at the pynvml boundary: every NVML function of the
``pynvml`` module is replaced by the fake's (``tests.fakes.fake_nvml``, 8 H100s, 0.2 ms per call, 20 ms per PCIe
throughput call); a function the fake does not model answers NVML_ERROR_NOT_SUPPORTED after the same 0.2 ms. nvitop
is imported with pynvml's ``_nvmlGetFunctionPointer`` hidden, so that it calls pynvml's functions (the fake) instead
of its ctypes shims straight into libnvidia-ml; the shims only add CPU, so this favours nvitop.

Both collect every second at the same time. Printed: CPU per collection (the process's utime + stime from
/proc/<pid>/stat over the window, divided by the collections it completed in the window) and per second,
/metrics p50/p99 over ``--scrapes`` plain GETs (alternating between the two; a server that closes the connection
after each response, as nvitop's WSGI server does, pays a reconnect each time, as Prometheus would), the series
and GPU fields each exports, and the ratios gpulens/nvitop. Usage: ``python -m bench.bench_peers [--window 30]
[--scrapes 500] [--repeat 1]``.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import logging
import multiprocessing
import os
import re
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench import options
from tests.conftest import free_port

CALL_LATENCY_S = 0.0002
PCIE_LATENCY_S = 0.02
GPUS = 8
TICKS = os.sysconf("SC_CLK_TCK")
# pynvml helpers that are not NVML calls: left alone.
NOT_CALLS = {"nvmlExceptionClass", "nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct", "nvmlErrorString"}


def inject(model: str) -> Counter[str]:
    """Replace pynvml's NVML functions by a fake node's; return the counter of calls to unmodelled functions."""
    import pynvml

    from gpulens.clock import SystemClock
    from tests.fakes.fake_nvml import FakeNvml

    make = FakeNvml.h200_node if model == "h200" else FakeNvml.h100_node
    fake = make(gpus=GPUS, clock=SystemClock(), latency_s=CALL_LATENCY_S, pcie_latency_s=PCIE_LATENCY_S)
    unmodelled: Counter[str] = Counter()

    def unsupported(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            unmodelled[name] += 1
            time.sleep(CALL_LATENCY_S)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

        return call

    for name in dir(pynvml):
        attr = getattr(pynvml, name)
        if not name.startswith("nvml") or name in NOT_CALLS or isinstance(attr, type) or not callable(attr):
            continue
        if name == "nvmlInitWithFlags":
            setattr(pynvml, name, lambda flags=0: fake.nvmlInit())
        elif hasattr(fake, name):
            setattr(pynvml, name, getattr(fake, name))
        else:
            setattr(pynvml, name, unsupported(name))
    return unmodelled


def serve(tool: str, port: int, model: str, collections: Any, ready: Any) -> None:
    """The child process: inject the fake, count collections, run the tool's own entry point until terminated."""
    logging.disable(logging.WARNING)
    unmodelled = inject(model)

    def report_unmodelled() -> None:
        time.sleep(8)
        names = ", ".join(sorted(unmodelled)) or "none"
        os.write(2, f"# {tool} called NVML functions the fake does not model (NotSupported): {names}\n".encode())

    threading.Thread(target=report_unmodelled, daemon=True).start()
    if tool == "gpulens":
        from gpulens.exporter.agent import ExporterOptions, run_exporter
        from gpulens.exporter.poller import Poller

        collect_once = Poller.collect_once

        def counted(self: Poller) -> None:
            collect_once(self)
            collections.value += 1

        Poller.collect_once = counted  # type: ignore[method-assign]
        options = ExporterOptions(source="nvml", listen=f"127.0.0.1:{port}", interval_s=1.0, node="bench")
        ready.set()
        run_exporter(options, lambda line: None, threading.Event())
        return
    import pynvml

    hidden = pynvml._nvmlGetFunctionPointer
    pynvml._nvmlGetFunctionPointer = None
    try:
        from nvitop_exporter import cli
        from nvitop_exporter.exporter import PrometheusExporter
    finally:
        pynvml._nvmlGetFunctionPointer = hidden
    update_device = PrometheusExporter.update_device
    devices_done = [0]

    def counted_device(self: Any, device: Any) -> None:
        update_device(self, device)
        devices_done[0] += 1
        if devices_done[0] % len(self.devices) == 0:
            collections.value += 1

    PrometheusExporter.update_device = counted_device  # type: ignore[method-assign]
    sys.argv = ["nvitop-exporter", "--bind-address", "127.0.0.1", "--port", str(port), "--interval", "1",
                "--hostname", "bench"]  # fmt: skip
    ready.set()
    with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):
        cli.main()


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Scraper:
    """GETs /metrics, keeping the connection open while the server allows it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn: http.client.HTTPConnection | None = None
        self.reconnects = 0

    def get(self) -> bytes:
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            self.reconnects += 1
        self.conn.request("GET", "/metrics")
        response = self.conn.getresponse()
        body = response.read()
        if response.will_close:
            self.conn.close()
            self.conn = None
        return body

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def exported(body: bytes) -> tuple[int, int, int]:
    """(series, series carrying a GPU uuid label, metric names with a value other than NaN for the first GPU)."""
    series = gpu_series = 0
    per_uuid: dict[str, set[str]] = {}
    for line in body.decode().splitlines():
        match = SAMPLE.match(line)
        if not match:
            continue
        series += 1
        uuid = re.search(r'(?:^|[{,])uuid="([^"]*)"', match.group(2) or "")
        if uuid:
            gpu_series += 1
            if match.group(3) == "NaN":
                continue
            per_uuid.setdefault(uuid.group(1), set()).add(match.group(1))
    first = min(per_uuid) if per_uuid else ""
    return series, gpu_series, len(per_uuid.get(first, ()))


def run_once(tools: list[str], window_s: float, scrapes: int, model: str) -> dict[str, dict[str, float]]:
    ctx = multiprocessing.get_context("spawn")
    procs: dict[str, Any] = {}
    counts: dict[str, Any] = {}
    ports: dict[str, int] = {}
    results: dict[str, dict[str, float]] = {t: {} for t in tools}
    try:
        for tool in tools:
            ports[tool] = free_port()
            counts[tool] = ctx.Value("q", 0)
            ready = ctx.Event()
            procs[tool] = ctx.Process(target=serve, args=(tool, ports[tool], model, counts[tool], ready), daemon=True)
            procs[tool].start()
            ready.wait(60)
        deadline = time.monotonic() + 60
        for tool in tools:  # wait for the first collections and a server that answers
            while counts[tool].value < 3:
                if not procs[tool].is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"{tool} did not start collecting")
                time.sleep(0.2)
        print(f"# CPU over {window_s:.0f} s of 1 s collections, both running", file=sys.stderr, flush=True)
        start = {t: (cpu_seconds(procs[t].pid), counts[t].value) for t in tools}
        began = time.perf_counter()
        time.sleep(window_s)
        wall = time.perf_counter() - began
        for t in tools:
            cpu = cpu_seconds(procs[t].pid) - start[t][0]
            done = counts[t].value - start[t][1]
            results[t]["cpu_ms_per_collection"] = cpu / max(done, 1) * 1000
            results[t]["cpu_percent"] = cpu / wall * 100
            results[t]["collections"] = done
        scrapers = {t: Scraper(ports[t]) for t in tools}
        latencies: dict[str, list[float]] = {t: [] for t in tools}
        bodies: dict[str, bytes] = {}
        for _ in range(scrapes):
            for t in tools:
                began = time.perf_counter()
                bodies[t] = scrapers[t].get()
                latencies[t].append(time.perf_counter() - began)
        for t in tools:
            scrapers[t].close()
            results[t]["p50_ms"] = percentile(latencies[t], 0.5) * 1000
            results[t]["p99_ms"] = percentile(latencies[t], 0.99) * 1000
            results[t]["body_kib"] = len(bodies[t]) / 1024
            results[t]["reconnects"] = scrapers[t].reconnects
            series, gpu_series, fields = exported(bodies[t])
            results[t]["series"] = series
            results[t]["gpu_series"] = gpu_series
            results[t]["gpu_fields"] = fields
    finally:
        for proc in procs.values():
            proc.terminate()
        for proc in procs.values():
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    return results


def main() -> int:
    parser = options.parser("bench.bench_peers", __doc__, "", "--repeat 3")
    parser.add_argument("--window", type=float, default=60.0, help="seconds of CPU measurement (default 60)")
    parser.add_argument("--scrapes", type=int, default=500, help="/metrics GETs per tool (default 500)")
    parser.add_argument("--repeat", type=int, default=1, help="runs; the medians are printed (default 1)")
    parser.add_argument("--model", choices=["h100", "h200"], default="h100", help="fake GPUs (h200: with GPM)")
    args = parser.parse_args()
    tools = ["gpulens"]
    have_peer = importlib.util.find_spec("nvitop_exporter") is not None
    if have_peer:
        tools.append("nvitop")
    else:
        print("peers_nvitop_exporter: not installed (pip install -e '.[bench]'); measuring gpulens only")
    runs = [run_once(tools, args.window, args.scrapes, args.model) for _ in range(args.repeat)]
    med = {t: {k: statistics.median(r[t][k] for r in runs) for k in runs[0][t]} for t in tools}
    gpus = f"{GPUS}gpu"
    units = {"cpu_ms_per_collection": "ms CPU", "cpu_percent": "% of one core", "p50_ms": "ms", "p99_ms": "ms",
             "body_kib": "KiB", "series": "series", "gpu_series": "series", "gpu_fields": "fields per GPU",
             "collections": "collections", "reconnects": "connections"}  # fmt: skip
    for t in tools:
        for key, value in med[t].items():
            shown = f"{value:.0f}" if units[key] in ("series", "fields per GPU", "collections", "connections") else (
                f"{value:.2f}")  # fmt: skip
            print(f"peers_{t}_{key}_{gpus}: {shown} {units[key]}")
    if have_peer:
        for key in ("cpu_ms_per_collection", "p50_ms", "p99_ms", "gpu_fields"):
            ratio = med["gpulens"][key] / med["nvitop"][key] if med["nvitop"][key] else float("nan")
            print(f"peers_ratio_{key}_{gpus}: {ratio:.2f} gpulens/nvitop")
    return 0


if __name__ == "__main__":
    sys.exit(main())
