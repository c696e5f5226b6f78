"""A driver that hangs is not an exporter that is down: an NVML call that never returns, faked at the pynvml boundary.

The exporter marks the node's NVML hung, keeps answering /metrics (the last GPU readings marked stale, the side
readers' parts fresh), ``GpuDriverHung``'s check fires and ``ExporterDown``'s does not. Counts and answers only: no
timing thresholds (a client timeout is a deadline that stops a broken test, nothing more).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.alerts import checks, hostchecks
from gpulens.alerts.catalogue import DEFINITIONS, EXPORTER_DOWN, GPU_DRIVER_HUNG
from gpulens.alerts.history import History
from gpulens.clock import ManualClock
from gpulens.collector.scrape import Scraper
from gpulens.collector.targets import Target
from gpulens.exporter.endpoints import Routes, exporter_server
from gpulens.exporter.nvml import NvmlSource
from gpulens.exporter.nvmldeadline import CallDeadline, NvmlHungError
from gpulens.exporter.poller import Poller
from gpulens.fabricmodel import HostReading
from gpulens.httpserver import HttpServer
from gpulens.model import NodeSnapshot, SourceError
from tests.conftest import http_get
from tests.fakes.fake_nvml import FakeNvml

RULES = {d.rule.name: d.rule for d in DEFINITIONS}
HUNG_CALL = "nvmlDeviceGetUtilizationRates"


def _eventually(predicate: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    """Poll ``predicate`` until it holds; the timeout only stops a broken test from hanging."""
    stop = time.monotonic() + timeout_s
    while time.monotonic() < stop:
        if predicate():
            return True
        time.sleep(0.02)
    return False


# --- the deadline itself, on a manual clock ------------------------------------------------------------------------


def test_a_call_past_its_deadline_marks_nvml_hung_and_later_calls_fail_fast_until_a_probe_passes() -> None:
    clock = ManualClock(1_700_000_000.0)
    deadline = CallDeadline(deadline_s=5.0, probe_every_s=30.0, monotonic=clock.monotonic, wall=clock.now)
    deadline.end(deadline.begin("nvmlDeviceGetCount"))
    stuck = deadline.begin(HUNG_CALL)
    clock.advance(5.0)
    assert deadline.hung_since() is None  # at the deadline, not past it
    clock.advance(0.5)
    assert deadline.hung_since() == clock.now() - 0.5
    assert deadline.hung_call() == HUNG_CALL
    with pytest.raises(NvmlHungError, match=HUNG_CALL):
        deadline.begin("nvmlDeviceGetTemperature")  # fails at once: nothing new is stranded
    clock.advance(60.0)
    with pytest.raises(NvmlHungError):
        deadline.begin("nvmlDeviceGetTemperature")  # still stuck: no probe while a call is in the driver
    deadline.end(stuck)  # the stuck call returns at last
    assert deadline.hung_since() is not None  # returning late proves nothing: the probe decides
    probe = deadline.begin("nvmlDeviceGetTemperature")  # 30 s since the last try: this call is the probe
    with pytest.raises(NvmlHungError):
        deadline.begin("nvmlDeviceGetPowerUsage")  # one probe at a time
    deadline.end(probe)
    assert deadline.hung_since() is None
    deadline.end(deadline.begin("nvmlDeviceGetPowerUsage"))


def test_a_probe_that_is_late_again_keeps_nvml_hung() -> None:
    clock = ManualClock(1_700_000_000.0)
    deadline = CallDeadline(deadline_s=1.0, probe_every_s=10.0, monotonic=clock.monotonic, wall=clock.now)
    deadline.end(_late_call(deadline, clock, 2.0))
    assert deadline.hung_since() is not None
    clock.advance(10.0)
    deadline.end(_late_call(deadline, clock, 2.0))  # the probe, past its deadline again
    assert deadline.hung_since() is not None
    with pytest.raises(NvmlHungError):
        deadline.begin("nvmlDeviceGetCount")  # the next probe waits its turn


def _late_call(deadline: CallDeadline, clock: ManualClock, seconds: float) -> int:
    token = deadline.begin(HUNG_CALL)
    clock.advance(seconds)
    return token


# --- the exporter, end to end --------------------------------------------------------------------------------------


class _Host:
    """A side reader that counts its runs: the node's host readings go on while NVML is hung."""

    def __init__(self) -> None:
        self.runs = 0

    def enrich(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        self.runs += 1
        return snapshot.replace(host=HostReading(node=snapshot.node, cpus=self.runs))


@pytest.fixture
def fake() -> Iterator[FakeNvml]:
    fake = FakeNvml.h100_node(gpus=2)
    yield fake
    fake.release_hangs()  # no thread stays stuck in the fake driver after the test


@pytest.fixture
def exporter(fake: FakeNvml) -> Iterator[tuple[Poller, HttpServer, _Host]]:
    deadline = CallDeadline(deadline_s=0.2, probe_every_s=0.3)
    source = NvmlSource("node-h", nvml=fake, xid_events=False, deadline=deadline)
    host = _Host()
    poller = Poller(source, interval_s=0.05, enrich=host.enrich, read_deadline_s=0.1)
    poller.collect_once()
    server = exporter_server(Routes(single=poller), host="127.0.0.1", port=0)
    server.start()
    poller.start()
    yield poller, server, host
    poller.stop()
    server.close()
    fake.release_hangs()
    source.close()


def _families(server: HttpServer) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, _, body = http_get(f"http://127.0.0.1:{server.port}/metrics", timeout=1.0)
    assert status == 200
    return {f.name: [(s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(body.decode())}


def test_a_call_that_never_returns_is_a_hung_driver_not_a_down_exporter(
    fake: FakeNvml, exporter: tuple[Poller, HttpServer, _Host]
) -> None:
    poller, server, host = exporter
    assert _families(server)["gpulens_node_nvml_hung"] == [({"node": "node-h"}, 0)]
    fake.hang(HUNG_CALL)
    assert _eventually(lambda: _families(server)["gpulens_node_nvml_hung"] == [({"node": "node-h"}, 1)])

    # /metrics keeps answering (each within the client's 1 s timeout), with the last GPU readings marked stale and
    # the host part refreshed by every collection.
    runs = host.runs
    answers = [_families(server) for _ in range(20)]
    assert len(answers) == 20
    last = answers[-1]
    assert len(last["gpulens_gpu_up"]) == 2
    assert ({"reader": "gpus"}, 1) in last["gpulens_exporter_reader_stale"]
    cpus = last["gpulens_host_cpus"][0][1]
    assert _eventually(lambda: _families(server)["gpulens_host_cpus"][0][1] > cpus + 3)
    assert host.runs > runs
    assert fake.max_concurrent(HUNG_CALL) <= 2  # one stuck call per GPU of the read in flight, no more

    # The collector's scrape: the target answers (up), the snapshot says NVML is hung and withdraws stale GPUs.
    scraper = Scraper(timeout_s=1.0, max_bytes=1_000_000)
    try:
        result = scraper.scrape(Target(name="node-h", url=f"http://127.0.0.1:{server.port}"))
    finally:
        scraper.close()
    assert result.health.up
    assert result.snapshot is not None
    assert result.snapshot.nvml_hung_since is not None
    assert result.snapshot.gpus == ()
    assert "gpus" in result.snapshot.stale
    history = History()
    now = time.time() + 120
    history.add(now, [result.snapshot], [result.health])
    hung = hostchecks.gpu_driver_hung(RULES[GPU_DRIVER_HUNG], history, now)
    assert [(c.rule, c.labels["node"]) for c in hung] == [(GPU_DRIVER_HUNG, "node-h")]
    assert checks.exporter_down(RULES[EXPORTER_DOWN], history, now) == []

    # The driver answers again: the probe passes and the GPU readings are fresh.
    fake.release_hangs()
    assert _eventually(lambda: _families(server)["gpulens_node_nvml_hung"] == [({"node": "node-h"}, 0)])
    assert _eventually(lambda: ({"reader": "gpus"}, 0) in _families(server)["gpulens_exporter_reader_stale"])
    assert poller.published().snapshot is not None


def test_the_hung_read_strands_one_read_thread_whatever_the_collections(
    fake: FakeNvml, exporter: tuple[Poller, HttpServer, _Host]
) -> None:
    _, _, host = exporter
    before = {t.ident for t in threading.enumerate()}
    calls = fake.calls[HUNG_CALL]
    fake.hang(HUNG_CALL)
    runs = host.runs
    assert _eventually(lambda: host.runs > runs + 20)  # twenty collections while the read is stuck
    # No thread was started for them beyond the source's fixed GPU pools growing to their size (2 + 4 threads here)
    started = [t.name for t in threading.enumerate() if t.ident not in before]
    assert all(name.startswith("gpulens-nvml") for name in started), started
    assert len([t for t in threading.enumerate() if t.name.startswith("gpulens-nvml")]) <= 6
    assert fake.calls[HUNG_CALL] - calls <= 2  # stuck once per GPU of the read in flight; the rest failed fast


# --- a driver already wedged when the exporter starts --------------------------------------------------------------


def test_a_driver_hung_before_the_start_is_served_as_hung_and_the_gpus_come_when_it_answers(fake: FakeNvml) -> None:
    from gpulens.exporter.nvmlstart import StartingSource, open_nvml

    fake.hang("nvmlInit")
    source = open_nvml("node-h", lambda: NvmlSource("node-h", nvml=fake, xid_events=False), deadline_s=0.2)
    assert isinstance(source, StartingSource)  # the opening is stuck: the exporter does not wait on it
    host = _Host()
    poller = Poller(source, interval_s=0.05, enrich=host.enrich, read_deadline_s=0.5)
    poller.collect_once()
    server = exporter_server(Routes(single=poller), host="127.0.0.1", port=0)
    server.start()
    poller.start()
    try:
        families = _families(server)  # answers (200), within the client's 1 s timeout
        assert families["gpulens_node_nvml_hung"] == [({"node": "node-h"}, 1)]
        assert "gpulens_gpu_up" not in families or families["gpulens_gpu_up"] == []
        assert _eventually(lambda: host.runs > 3)  # the side readers go on
        status, _, _ = http_get(f"http://127.0.0.1:{server.port}/healthz", timeout=1.0)
        assert status == 200  # answering, so ExporterDown stays silent

        scraper = Scraper(timeout_s=1.0, max_bytes=1_000_000)
        try:
            result = scraper.scrape(Target(name="node-h", url=f"http://127.0.0.1:{server.port}"))
        finally:
            scraper.close()
        assert result.health.up
        assert result.snapshot is not None
        history = History()
        now = time.time() + 120
        history.add(now, [result.snapshot], [result.health])
        hung = hostchecks.gpu_driver_hung(RULES[GPU_DRIVER_HUNG], history, now)
        assert [(c.rule, c.labels["node"]) for c in hung] == [(GPU_DRIVER_HUNG, "node-h")]
        assert checks.exporter_down(RULES[EXPORTER_DOWN], history, now) == []

        fake.release_hangs()  # the driver answers: the opening completes and the GPUs are read
        assert _eventually(lambda: len(_families(server).get("gpulens_gpu_up", [])) == 2)
        assert _eventually(lambda: _families(server)["gpulens_node_nvml_hung"] == [({"node": "node-h"}, 0)])
    finally:
        poller.stop()
        server.close()
        fake.release_hangs()
        source.close()


def test_an_opening_that_fails_in_time_raises_its_error_at_once() -> None:
    from gpulens.exporter.nvmlstart import open_nvml

    fake = FakeNvml.h100_node(gpus=1)
    fake.init_error = 9  # NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(SourceError):
        open_nvml("node-h", lambda: NvmlSource("node-h", nvml=fake, xid_events=False), deadline_s=5.0)
