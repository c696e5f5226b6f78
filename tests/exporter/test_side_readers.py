"""GPU readings never wait for a side reader: a kubelet that answers 15 MiB or not at all, an exporter starved of CPU.

Counts and answers, never timings: the caps are shown by the pods counted, the collections by their number, and a
client timeout is only a deadline that stops a broken test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.alerts import checks
from gpulens.alerts.catalogue import DEFINITIONS, EXPORTER_DOWN
from gpulens.alerts.history import History
from gpulens.collector.scrape import Scraper
from gpulens.collector.targets import Target
from gpulens.exporter.podresources import api_pb2
from gpulens.exporter.podresources.background import BackgroundLister
from gpulens.exporter.podresources.client import MAX_PODS, KubeletClient
from gpulens.exporter.podresources.mapper import UNAVAILABLE, PodMapper
from gpulens.exporter.poller import Poller
from gpulens.exporter.sidereader import SideReader
from tests.conftest import free_port, http_get
from tests.exporter.test_podresources import Kubelet, pod
from tests.fakes.static_source import StaticSource, node_snapshot

MIB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


def _eventually(predicate: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """Poll ``predicate`` until it holds; the timeout only stops a broken test from hanging."""
    stop = time.monotonic() + timeout_s
    while time.monotonic() < stop:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def _families(body: bytes) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(body.decode())}


def _huge_answer(gpu_uuid: str, pods: int = 4250) -> list[api_pb2.PodResources]:
    """About 15 MiB of pods: the first holds ``gpu_uuid``, the others long lists of another resource's devices."""
    ids = [f"fpga-{n:04d}-" + "x" * 80 for n in range(40)]
    answer = [pod("ml", "p0", ("c", "nvidia.com/gpu", [gpu_uuid]))]
    answer += [pod("batch", f"p{i}", ("c", "example.com/fpga", ids)) for i in range(1, pods)]
    return answer


def test_a_kubelet_answering_15_mib_is_capped_and_leaves_the_gpu_series(kubelet: tuple[Kubelet, str]) -> None:
    servicer, path = kubelet
    source = StaticSource(node_snapshot("gpu-07", gpus=8))
    servicer.pods = _huge_answer(source.snapshot.gpus[0].uuid)
    size = api_pb2.ListPodResourcesResponse(pod_resources=servicer.pods).ByteSize()
    assert 14 * MIB < size < 16 * MIB
    client = KubeletClient(path, timeout_s=20.0)
    lister = BackgroundLister(client, interval_s=60.0, deadline_s=20.0, start=False)
    poller = Poller(
        source, interval_s=1.0, enrich=PodMapper(lister, clock=lambda: 0.0).enrich, readers={"pods": lister.state}
    )
    try:
        poller.collect_once()  # before the kubelet answered: GPU readings, no pods, the pods part stale
        first = _families(poller.published().metrics)
        assert len(first["gpulens_gpu_up"]) == 8
        assert ({"reader": "pods"}, 1) in first["gpulens_exporter_reader_stale"]
        lister.reader.fetch_now()  # the reader's step, here on the test's thread
        poller.collect_once()
        published = poller.published()
    finally:
        client.close()
    assert (client.pods_read, client.truncated) == (MAX_PODS, 1)  # 4,250 pods answered, 1,024 turned into records
    assert len(lister.list()) == MAX_PODS
    families = _families(published.metrics)
    assert len(families["gpulens_gpu_up"]) == 8
    assert ({"reader": "pods"}, 0) in families["gpulens_exporter_reader_stale"]
    assert [labels["job_id"] for labels, _ in families["gpulens_pod_gpu_info"]] == ["ml/p0"]


def test_an_answer_past_the_byte_cap_is_refused_and_marks_only_the_pods_stale(kubelet: tuple[Kubelet, str]) -> None:
    servicer, path = kubelet
    source = StaticSource(node_snapshot("gpu-07", gpus=8))
    servicer.pods = _huge_answer(source.snapshot.gpus[0].uuid)
    client = KubeletClient(path, timeout_s=20.0, max_bytes=4 * MIB)
    lister = BackgroundLister(client, interval_s=60.0, deadline_s=20.0, start=False)
    poller = Poller(
        source, interval_s=1.0, enrich=PodMapper(lister, clock=lambda: 0.0).enrich, readers={"pods": lister.state}
    )
    try:
        lister.reader.fetch_now()
        poller.collect_once()
    finally:
        client.close()
    assert "RESOURCE_EXHAUSTED" in (lister.reader.error or "")
    assert client.pods_read == 0  # nothing of the answer was turned into records
    families = _families(poller.published().metrics)
    assert len(families["gpulens_gpu_up"]) == 8
    assert ({"reader": "pods"}, 1) in families["gpulens_exporter_reader_stale"]
    assert ({"reader": "gpus"}, 0) in families["gpulens_exporter_reader_stale"]
    assert ({"reason": UNAVAILABLE}, 1.0) in families["gpulens_exporter_collect_errors"]


def test_collections_go_on_while_the_kubelet_does_not_answer() -> None:
    answered = threading.Event()
    calls = []

    def stuck_kubelet() -> tuple[Any, ...]:
        calls.append(1)
        answered.wait()
        return ()

    reader = SideReader("pods", stuck_kubelet, interval_s=0.05, deadline_s=0.1)
    source = StaticSource(node_snapshot("gpu-07", gpus=8))
    poller = Poller(source, interval_s=1.0, readers={"pods": reader.state})
    try:
        assert _eventually(lambda: calls == [1])
        for _ in range(20):
            poller.collect_once()
        assert source.reads == 20  # twenty collections, twenty reads: none waited for the kubelet
        assert calls == [1]  # the reader's one thread is the only one stuck
        families = _families(poller.published().metrics)
        assert len(families["gpulens_gpu_up"]) == 8
        assert ({"reader": "pods"}, 1) in families["gpulens_exporter_reader_stale"]
    finally:
        answered.set()
        reader.close()


# --- an exporter starved of CPU (cgroup CFS bandwidth: v2 cpu.max, or v1 cpu.cfs_quota_us) ----------------------

TENTH_OF_A_CORE_US = (10_000, 100_000)  # quota, period: 10 ms of CPU every 100 ms
SCENARIO = """
[cluster]
nodes = 1
gpus_per_node = 8
gpu_model = "H100-SXM5-80GB"
seed = 3
start = "2026-01-01T00:00:00Z"
duration = "60m"
step = "10s"

[[jobs]]
id = "llm"
user = "alice"
kind = "training"
gpus = ["node-00:0-7"]
"""


def _throttle_group() -> tuple[Path, Callable[[int], None]] | str:
    """A child cgroup limited to a tenth of a core and a function that moves a pid into it; or why there is none."""
    name = f"gpulens-throttle-{os.getpid()}"
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").exists() and "cpu" in (v2 / "cgroup.subtree_control").read_text().split():
        group = v2 / name
        try:
            group.mkdir()
            (group / "cpu.max").write_text(f"{TENTH_OF_A_CORE_US[0]} {TENTH_OF_A_CORE_US[1]}\n")
        except OSError as exc:
            return f"cgroup v2 is not writable here: {exc}"
        return group, lambda pid: (group / "cgroup.procs").write_text(f"{pid}\n")  # type: ignore[func-returns-value]
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").exists():
        group = v1 / name
        try:
            group.mkdir()
            (group / "cpu.cfs_period_us").write_text(f"{TENTH_OF_A_CORE_US[1]}\n")
            (group / "cpu.cfs_quota_us").write_text(f"{TENTH_OF_A_CORE_US[0]}\n")
        except OSError as exc:
            return f"the cgroup v1 cpu controller is not writable here: {exc}"
        return group, lambda pid: (group / "cgroup.procs").write_text(f"{pid}\n")  # type: ignore[func-returns-value]
    return "no cgroup CPU controller (v2 cpu.max or v1 cpu.cfs_quota_us) is mounted here"


@pytest.fixture
def throttle() -> Iterator[tuple[Path, Callable[[int], None]]]:
    made = _throttle_group()
    if isinstance(made, str):
        pytest.skip(made)
    group, move = made
    yield group, move
    parent = group.parent
    for pid in (group / "cgroup.procs").read_text().split():  # back to the parent before the group is removed
        with contextlib.suppress(OSError):  # the process may have ended
            (parent / "cgroup.procs").write_text(f"{pid}\n")
    group.rmdir()


def test_an_exporter_throttled_to_a_tenth_of_a_core_keeps_its_gpu_series(
    throttle: tuple[Path, Callable[[int], None]], tmp_path: Path
) -> None:
    """A 25 s window (100 intervals of 0.25 s, each a collection the starved exporter must finish within its 3 s
    staleness limit) under a tenth of a core, shared with a busy loop (an idle exporter
    needs less than that): /metrics always answers 200 with the GPU series, and the collector's scrape finds the
    exporter up (no ExporterDown)."""
    group, move = throttle
    scenario = tmp_path / "one-node.toml"
    scenario.write_text(SCENARIO)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    argv = [sys.executable, "-m", "gpulens.cli", "exporter", "--source", "sim", "--scenario", str(scenario)]
    argv += ["--listen", f"127.0.0.1:{port}", "--interval", "0.25", "--speed", "10"]
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    statuses: list[int] = []
    gpu_series: list[int] = []
    scrapes_up: list[bool] = []
    scraper = Scraper(timeout_s=10.0, max_bytes=10_000_000)
    history = History()
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        assert _eventually(lambda: _answers(base + "/healthz")), proc.stderr.read() if proc.stderr else ""
        move(hog.pid)
        move(proc.pid)
        assert str(proc.pid) in (group / "cgroup.procs").read_text().split()
        window_ends = time.monotonic() + 25.0
        while time.monotonic() < window_ends:
            status, _, body = http_get(base + "/metrics", timeout=10.0)
            statuses.append(status)
            gpu_series.append(len(_families(body).get("gpulens_gpu_up", [])) if status == 200 else 0)
            result = scraper.scrape(Target(name="node-00", url=base))
            scrapes_up.append(result.health.up)
            history.add(time.time(), [result.snapshot] if result.snapshot else [], [result.health])
            time.sleep(1.0)
        throttled = _cpu_stat(group).get("nr_throttled", 0)
    finally:
        scraper.close()
        hog.kill()
        hog.wait(timeout=60)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    assert throttled > 0  # the limit took effect: the kernel held the exporter back
    assert len(statuses) >= 15
    assert set(statuses) == {200}  # never 503
    assert set(gpu_series) == {8}
    assert all(scrapes_up)
    rule = next(d.rule for d in DEFINITIONS if d.rule.name == EXPORTER_DOWN)
    assert checks.exporter_down(rule, history, time.time()) == []


def _cpu_stat(group: Path) -> dict[str, int]:
    pairs = (line.split() for line in (group / "cpu.stat").read_text().splitlines())
    return {key: int(value) for key, value in pairs}


def _answers(url: str) -> bool:
    try:
        return http_get(url, timeout=2.0)[0] == 200
    except OSError:
        return False
