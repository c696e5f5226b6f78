"""Exporter benchmarks on the fake NVML with realistic per-call latencies (0.2 ms per call, 20 ms per PCIe call).

Prints: the time of one collection cycle, /metrics latency p50/p99 over 1,000 scrapes over HTTP keep-alive (a new
collection every 100 scrapes, so 1 % of them render), and the exporter process's CPU use while collecting every
second (no scrapes), for 8 GPUs (three windows, with the load average) and 16 GPUs. The CPU figure includes the fake
NVML's own Python work, which a real driver does not do, so it is also split: the same collections with zero
latencies, run on one thread under cProfile, attribute each function's time to the fake (``tests.fakes``) or to the
exporter (stdlib, builtins and pynvml count for the caller that ran them: pynvml's structures cost the exporter to
read on a real driver too, but the fake also fills them in Python); ``exporter_cpu_8gpu_without_fake`` subtracts the
fake's share from the measured CPU. The time the fake's latencies cost in thread switches stays in the exporter's
figure: a real driver's calls block and switch threads too. The fake's XID wait is set to the exporter's real wait
(``XID_WAIT_MS``), so its event thread wakes as often as it would on a driver.
"""

from __future__ import annotations

import collections
import cProfile
import http.client
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from bench import options
from gpulens.clock import SystemClock
from gpulens.exporter.endpoints import Routes, exporter_server
from gpulens.exporter.nvml import NvmlSource
from gpulens.exporter.nvmlxid import XID_WAIT_MS
from gpulens.exporter.poller import Poller
from tests.fakes.fake_nvml import FakeNvml

CALL_LATENCY_S = 0.0002
PCIE_LATENCY_S = 0.02
SCRAPES = 1000
CPU_WINDOW_S = 20.0
CPU_REPEATS = 3
PROFILED_COLLECTIONS = 50


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def fake_nvml(gpus: int, *, latency_s: float = CALL_LATENCY_S, pcie_latency_s: float = PCIE_LATENCY_S) -> FakeNvml:
    nvml = FakeNvml.h100_node(gpus=gpus, clock=SystemClock(), latency_s=latency_s, pcie_latency_s=pcie_latency_s)
    nvml.event_wait_cap_s = XID_WAIT_MS / 1000  # as often as a real driver wakes the XID thread
    return nvml


def cpu_share(poller: Poller, window_s: float) -> float:
    """The process's CPU seconds per wall second while ``poller`` collects on its thread."""
    poller.start()
    time.sleep(2.0)  # past the first collections
    cpu0, wall0 = time.process_time(), time.perf_counter()
    time.sleep(window_s)
    return (time.process_time() - cpu0) / (time.perf_counter() - wall0)


def bench(gpus: int, cpu_repeats: int) -> list[float]:
    nvml = fake_nvml(gpus)
    source = NvmlSource(f"bench-{gpus}", nvml=nvml)
    poller = Poller(source, interval_s=1.0)
    cycles = []
    for _ in range(10):
        started = time.perf_counter()
        poller.collect_once()
        cycles.append(time.perf_counter() - started)
    print(f"exporter_collect_cycle_{gpus}gpu_p50: {statistics.median(cycles) * 1000:.1f} ms", flush=True)

    server = exporter_server(Routes(single=poller), host="127.0.0.1", port=0)
    server.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        latencies = []
        size = 0
        for index in range(SCRAPES):
            if index % 100 == 0:
                poller.collect_once()  # a new collection: the next scrape renders it
            started = time.perf_counter()
            conn.request("GET", "/metrics")
            body = conn.getresponse().read()
            latencies.append(time.perf_counter() - started)
            size = len(body)
        conn.close()
        print(f"exporter_metrics_{gpus}gpu_p50: {percentile(latencies, 0.5) * 1000:.2f} ms")
        print(f"exporter_metrics_{gpus}gpu_p99: {percentile(latencies, 0.99) * 1000:.2f} ms")
        print(f"exporter_metrics_{gpus}gpu_body: {size / 1024:.1f} KiB", flush=True)
    finally:
        server.close()
        source.close()
    shares = []
    for _ in range(cpu_repeats):
        print(f"# measuring CPU over {CPU_WINDOW_S:.0f} s of 1 s collections", file=sys.stderr, flush=True)
        source = NvmlSource(f"bench-{gpus}", nvml=fake_nvml(gpus))
        poller = Poller(source, interval_s=1.0)
        try:
            share = cpu_share(poller, CPU_WINDOW_S)
        finally:
            poller.stop()
            source.close()
        shares.append(share)
        load = os.getloadavg()[0]
        print(f"exporter_cpu_{gpus}gpu_1s_interval: {share * 100:.2f} % of one core (load average {load:.1f})")
    return shares


class _Inline:
    """An executor that runs each task at once on the calling thread, so that cProfile sees all of a collection."""

    def map(self, function: Callable[[Any], Any], items: Iterable[Any]) -> list[Any]:
        return [function(item) for item in items]

    def submit(self, function: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        future.set_result(function(*args))
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass


def _owner(filename: str) -> str | None:
    """Who a function's time belongs to: the fake, the exporter, or None: its caller's (stdlib, builtins, and pynvml,
    whose structures the fake fills in Python where a real driver fills them in C, and the exporter reads anyway)."""
    if "/tests/fakes/" in filename:
        return "fake"
    if "/exporter/" in filename or "/gpulens/" in filename:
        return "exporter"
    return None


def attribute(stats: pstats.Stats) -> dict[str, float]:
    """CPU seconds by owner; time in stdlib and builtins goes to the callers, split by their calls' cumulative time."""
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    owners: dict[str, float] = collections.defaultdict(float)
    pending: dict[Any, float] = {}
    for func, (_, _, own, _, _) in table.items():
        owner = _owner(func[0])
        if owner is None:
            pending[func] = pending.get(func, 0.0) + own
        else:
            owners[owner] += own
    for _ in range(20):
        if not pending:
            break
        passed: dict[Any, float] = {}
        for func, seconds in pending.items():
            callers = table[func][4] if func in table else {}
            weights = {caller: edge[3] for caller, edge in callers.items() if edge[3] > 0}
            total = sum(weights.values())
            if not total:
                owners["other"] += seconds
                continue
            for caller, weight in weights.items():
                share = seconds * weight / total
                owner = _owner(caller[0])
                if owner is None:
                    passed[caller] = passed.get(caller, 0.0) + share
                else:
                    owners[owner] += share
        pending = passed
    owners["other"] += sum(pending.values())
    return owners


def profile_zero_latency(gpus: int) -> tuple[float, dict[str, float]]:
    """CPU ms per collection with zero latencies on one thread, and its shares by owner under cProfile."""
    source = NvmlSource(f"bench-{gpus}", nvml=fake_nvml(gpus, latency_s=0, pcie_latency_s=0), xid_events=False)
    source._pool = source._pcie_pool = _Inline()  # type: ignore[assignment]
    poller = Poller(source, interval_s=1.0)
    try:
        for _ in range(3):
            poller.collect_once()
            poller.published().metrics_gzip  # noqa: B018 - as a scrape does once per collection
        cpu0 = time.process_time()
        for _ in range(PROFILED_COLLECTIONS):
            poller.collect_once()
        plain = (time.process_time() - cpu0) / PROFILED_COLLECTIONS
        profiler = cProfile.Profile(time.process_time)
        profiler.enable()
        for _ in range(PROFILED_COLLECTIONS):
            poller.collect_once()
        profiler.disable()
    finally:
        source.close()
    owners = attribute(pstats.Stats(profiler))
    return plain * 1000, owners


def main() -> None:
    options.no_arguments(__spec__.name if __spec__ else __name__, __doc__)
    shares = bench(8, CPU_REPEATS)
    plain_ms, owners = profile_zero_latency(8)
    total = sum(owners.values()) or 1.0
    print(f"exporter_cpu_8gpu_zero_latency_one_thread: {plain_ms:.2f} ms per collection")
    for owner in ("exporter", "fake", "other"):
        print(f"exporter_cpu_8gpu_profile_{owner}: {owners.get(owner, 0.0) / total * 100:.1f} %")
    fake_ms = plain_ms * owners["fake"] / total
    median = statistics.median(shares) * 100
    print(f"exporter_cpu_8gpu_1s_interval_median: {median:.2f} % of one core")
    print(f"exporter_cpu_8gpu_fake_nvml_own: {fake_ms / 10:.2f} % of one core")
    print(f"exporter_cpu_8gpu_without_fake: {median - fake_ms / 10:.2f} % of one core")
    bench(16, 1)


if __name__ == "__main__":
    main()
