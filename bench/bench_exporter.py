"""Exporter benchmarks on the fake NVML with realistic per-call latencies (0.2 ms per call, 20 ms per PCIe call).

Prints: the time of one collection cycle, /metrics latency p50/p99 over 1,000 scrapes over HTTP keep-alive, and the
exporter process's CPU use while collecting every second, for 8 and 16 GPUs.
"""

from __future__ import annotations

import http.client
import statistics
import sys
import time

from exporter.httpserver import ExporterServer, Routes
from exporter.nvml import NvmlSource
from exporter.poller import Poller
from gpulens.clock import SystemClock
from tests.fakes.fake_nvml import FakeNvml

CALL_LATENCY_S = 0.0002
PCIE_LATENCY_S = 0.02
SCRAPES = 1000
CPU_WINDOW_S = 20.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench(gpus: int) -> None:
    nvml = FakeNvml.h100_node(gpus=gpus, clock=SystemClock(), latency_s=CALL_LATENCY_S, pcie_latency_s=PCIE_LATENCY_S)
    source = NvmlSource(f"bench-{gpus}", nvml=nvml)
    poller = Poller(source, interval_s=1.0)
    cycles = []
    for _ in range(10):
        started = time.perf_counter()
        poller.collect_once()
        cycles.append(time.perf_counter() - started)
    print(f"exporter_collect_cycle_{gpus}gpu_p50: {statistics.median(cycles) * 1000:.1f} ms", flush=True)

    server = ExporterServer(Routes(single=poller), host="127.0.0.1", port=0)
    server.start()
    poller.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        latencies = []
        size = 0
        for _ in range(SCRAPES):
            started = time.perf_counter()
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
            latencies.append(time.perf_counter() - started)
            size = len(body)
        conn.close()
        print(f"exporter_metrics_{gpus}gpu_p50: {percentile(latencies, 0.5) * 1000:.2f} ms")
        print(f"exporter_metrics_{gpus}gpu_p99: {percentile(latencies, 0.99) * 1000:.2f} ms")
        print(f"exporter_metrics_{gpus}gpu_body: {size / 1024:.1f} KiB")
        print(f"# measuring CPU over {CPU_WINDOW_S:.0f} s of 1 s collections", file=sys.stderr, flush=True)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        time.sleep(CPU_WINDOW_S)
        cpu = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        print(f"exporter_cpu_{gpus}gpu_1s_interval: {cpu * 100:.2f} % of one core", flush=True)
    finally:
        server.close()
        poller.stop()
        source.close()


def main() -> None:
    for gpus in (8, 16):
        bench(gpus)


if __name__ == "__main__":
    main()
