"""The dcgm-exporter source (exporter.dcgmsource): XID counting, cumulative errors, and fetching over real HTTP."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given

from gpulens.clock import ManualClock
from gpulens.exporter.dcgmsource import DcgmSource
from gpulens.exporter.endpoints import Routes, exporter_server
from gpulens.exporter.poller import Poller
from gpulens.httpfetch import fetch_url
from gpulens.model import SourceError
from tests.conftest import http_get
from tests.fakes.dcgm_pages import FUZZ, GPU0, GPU1, ID0, ID1, fixture, mutated_fixture, parse
from tests.fakes.dcgm_server import stand_in_dcgm_exporter


@FUZZ
@given(mutated_fixture())
def test_fuzz_source_reads_or_raises_source_error(data: bytes) -> None:
    source = DcgmSource("http://127.0.0.1:9400/metrics", node="n", fetch=lambda url, timeout: data)
    try:
        snapshot = source.read()
    except SourceError as exc:
        message = str(exc)
    else:
        message = None
        assert (snapshot.source, snapshot.node) == ("dcgm", "n")
        assert all(v > 0 for g in snapshot.gpus for v in g.xid_errors.values())
    assert message is None or message.startswith("dcgm-exporter at http://127.0.0.1:9400/metrics ")


# --- the stateful source -------------------------------------------------------------------------------------------


class PageSequence:
    """A fetch that serves the given pages in turn (a page that is an exception is raised)."""

    def __init__(self, *pages: str | bytes | SourceError) -> None:
        self.pages = list(pages)
        self.calls: list[tuple[str, float]] = []

    def __call__(self, url: str, timeout_s: float) -> bytes:
        self.calls.append((url, timeout_s))
        page = self.pages.pop(0)
        if isinstance(page, SourceError):
            raise page
        return page.encode() if isinstance(page, str) else page


def xid_page(gpu0: int | None, gpu1: int | None) -> str:
    lines = [f"DCGM_FI_DEV_GPU_TEMP{{{ID0}}} 40", f"DCGM_FI_DEV_GPU_TEMP{{{ID1}}} 40"]
    if gpu0 is not None:
        lines.append(f"DCGM_FI_DEV_XID_ERRORS{{{ID0}}} {gpu0}")
    if gpu1 is not None:
        lines.append(f"DCGM_FI_DEV_XID_ERROR{{{ID1}}} {gpu1}")
    return "\n".join(lines) + "\n"


def test_xid_last_value_becomes_per_code_counts_across_reads() -> None:
    pages = PageSequence(
        xid_page(0, 48),  # GPU 1 shows XID 48 at start-up: counted once
        xid_page(43, 48),  # GPU 0: new code 43
        xid_page(43, 48),  # unchanged: nothing new
        xid_page(79, None),  # GPU 0: 79; GPU 1 missing: keeps its last code
        xid_page(0, 48),  # GPU 0 cleared; GPU 1 still 48 after the gap: not new
        xid_page(43, 48),  # GPU 0: 43 again after a clear counts again
    )
    source = DcgmSource("http://127.0.0.1:9400/metrics", fetch=pages)
    history = [{g.gpu: dict(g.xid_errors) for g in source.read().gpus} for _ in range(6)]

    assert history[0] == {0: {}, 1: {48: 1}}
    assert history[1] == {0: {43: 1}, 1: {48: 1}}
    assert history[2] == history[1]
    assert history[3] == {0: {43: 1, 79: 1}, 1: {48: 1}}
    assert history[5] == {0: {43: 2, 79: 1}, 1: {48: 1}}


def test_snapshot_carries_node_time_records_and_cumulative_errors() -> None:
    clock = ManualClock(1_700_000_000.0)
    pages = PageSequence(fixture("legacy.prom"), SourceError("dcgm-exporter at x: boom"), fixture("malformed.prom"))
    source = DcgmSource("http://127.0.0.1:9400/metrics", clock=clock, timeout_s=2.5, fetch=pages)

    first = source.read()
    assert (first.node, first.timestamp, first.source, first.driver_version) == (
        "gpu-node-07",
        1_700_000_000.0,
        "dcgm",
        "550.54.15",
    )
    assert [g.uuid for g in first.gpus] == [GPU0, GPU1]
    assert [j.job_id for j in first.jobs] == ["ml-team/llm-train-0"]
    assert first.errors == {"dcgm_sentinel": 1}
    clock.advance(30)
    with pytest.raises(SourceError, match="boom"):
        source.read()
    third = source.read()
    assert third.timestamp == 1_700_000_030.0
    # malformed.prom holds other GPUs: legacy.prom's two are reported down, counted once each.
    assert third.errors == {
        "dcgm_sentinel": 1,
        "dcgm_fetch_failed": 1,
        "dcgm_bad_lines": 11,
        "dcgm_truncated": 1,
        "dcgm_gpu_missing": 2,
    }
    assert {g.uuid for g in third.gpus if not g.up} == {GPU0, GPU1}
    assert pages.calls == [("http://127.0.0.1:9400/metrics", 2.5)] * 3


def test_node_falls_back_to_this_host() -> None:
    source = DcgmSource("http://127.0.0.1:9400/metrics", fetch=PageSequence(f"DCGM_FI_DEV_GPU_TEMP{{{ID0}}} 4\n"))
    snapshot = source.read()
    assert snapshot.node == socket.gethostname()
    assert snapshot.gpus[0].node == socket.gethostname()


@pytest.mark.parametrize(
    ("page", "message"),
    [
        (b"DCGM_FI_DEV_GPU_TEMP 4\xff\n", "not UTF-8"),
        (b"<html><body>login</body></html>\n", "no GPU series on the page"),
        (b"x" * 2000, "more than 1000 bytes"),
    ],
)
def test_unusable_pages_raise_source_error_and_count(page: bytes, message: str) -> None:
    good = f"DCGM_FI_DEV_GPU_TEMP{{{ID0}}} 4\n"
    source = DcgmSource("http://u:hunter2@127.0.0.1:9400/metrics", max_bytes=1000, fetch=PageSequence(page, good))
    with pytest.raises(SourceError, match=message) as info:
        source.read()
    assert "hunter2" not in str(info.value)
    unusable = message == "no GPU series on the page"
    errors = source.read().errors
    assert errors.get("dcgm_fetch_failed", 0) == (0 if unusable else 1)
    assert errors.get("dcgm_no_gpu_series", 0) == (1 if unusable else 0)


def test_an_empty_page_is_unusable_not_a_node_without_gpus() -> None:
    source = DcgmSource("http://127.0.0.1:9400/metrics", node="n", fetch=PageSequence("", "# HELP x y\nfoo_bar 1\n"))
    with pytest.raises(SourceError, match=r"no GPU series on the page \(0 samples\)"):
        source.read()
    with pytest.raises(SourceError, match=r"no GPU series on the page \(1 samples, e.g. 'foo_bar'\)"):
        source.read()


@pytest.mark.parametrize(
    "url", ["ftp://h/metrics", "127.0.0.1:9400", "http:///metrics", "http://u:pw@h:port/x", "http://u:pw@[::1/x"]
)
def test_bad_urls_are_refused_at_construction_without_credentials(url: str) -> None:
    with pytest.raises(ValueError, match="dcgm-exporter URL") as info:
        DcgmSource(url)
    assert ":pw" not in str(info.value)


# --- fetching over real HTTP ---------------------------------------------------------------------------------------


@dataclass
class Behaviour:
    body: bytes = b""
    status: int = 200
    gzip: bool = False
    send_length: bool = True
    hang: bool = False
    basic_auth: str | None = None  # "user:password" the server insists on
    location: str | None = None  # sent as a redirect target
    seen_headers: list[dict[str, str]] = field(default_factory=list)


class _Server(ThreadingHTTPServer):
    behaviour: Behaviour
    release: threading.Event


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        behaviour = self.server.behaviour
        behaviour.seen_headers.append(dict(self.headers))
        if behaviour.hang:
            self.server.release.wait(30)
            return
        expected = behaviour.basic_auth and "Basic " + base64.b64encode(behaviour.basic_auth.encode()).decode()
        status = 401 if expected and self.headers.get("Authorization") != expected else behaviour.status
        body = gzip.compress(behaviour.body) if behaviour.gzip else behaviour.body
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        if behaviour.gzip:
            self.send_header("Content-Encoding", "gzip")
        if behaviour.send_length:
            self.send_header("Content-Length", str(len(body)))
        if behaviour.location:
            self.send_header("Location", behaviour.location)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the tests assert on what the client sees."""


@pytest.fixture
def serve() -> Iterator[Callable[[Behaviour], str]]:
    started: list[tuple[_Server, threading.Thread]] = []

    def start(behaviour: Behaviour) -> str:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.behaviour = behaviour
        server.release = threading.Event()
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        started.append((server, thread))
        return f"http://127.0.0.1:{server.server_address[1]}/metrics"

    yield start
    for server, thread in started:
        server.release.set()
        server.shutdown()
        server.server_close()
        thread.join()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize("compressed", [False, True])
def test_reads_a_real_exporter_plain_and_gzip(serve: Callable[[Behaviour], str], compressed: bool) -> None:
    behaviour = Behaviour(body=fixture("current.prom").encode(), gzip=compressed)
    snapshot = DcgmSource(serve(behaviour)).read()

    assert snapshot.gpus == tuple(
        dataclasses.replace(
            g,
            xid_errors={48: 1} if g.uuid == GPU1 else {},
            timestamp=snapshot.timestamp,
            throttle_reasons_source="reported",  # the page serves DCGM's clock-event reasons (field 112)
        )
        for g in parse(fixture("current.prom")).gpus
    )
    assert behaviour.seen_headers[0]["Accept-Encoding"] == "gzip"
    assert "Authorization" not in behaviour.seen_headers[0]


def test_credentials_are_sent_as_basic_auth_and_never_shown(serve: Callable[[Behaviour], str]) -> None:
    behaviour = Behaviour(body=fixture("legacy.prom").encode(), basic_auth="alice:s3cr@t-pw")
    url = serve(behaviour)
    good = url.replace("http://", "http://alice:s3cr%40t-pw@")
    assert len(DcgmSource(good).read().gpus) == 2

    bad = url.replace("http://", "http://alice:wr0ng-pw@")
    with pytest.raises(SourceError, match="HTTP 401") as info:
        DcgmSource(bad).read()
    assert "wr0ng-pw" not in str(info.value)
    assert "alice" not in str(info.value)

    refused = f"http://alice:s3cr3t-pw@127.0.0.1:{free_port()}/metrics"
    with pytest.raises(SourceError, match="refused") as info:
        DcgmSource(refused).read()
    assert "s3cr3t-pw" not in str(info.value)
    assert "***@127.0.0.1" in str(info.value)


def test_http_500_is_a_source_error(serve: Callable[[Behaviour], str]) -> None:
    with pytest.raises(SourceError, match="HTTP 500"):
        DcgmSource(serve(Behaviour(body=b"oops", status=500))).read()


def test_redirects_are_not_followed(serve: Callable[[Behaviour], str]) -> None:
    elsewhere = Behaviour(body=fixture("legacy.prom").encode())
    redirecting = Behaviour(status=302, location=serve(elsewhere))
    with pytest.raises(SourceError, match="HTTP 302"):
        DcgmSource(serve(redirecting).replace("http://", "http://bob:pw-123@")).read()
    assert redirecting.seen_headers[0]["Authorization"] == "Basic " + base64.b64encode(b"bob:pw-123").decode()
    assert elsewhere.seen_headers == []  # the credentials went nowhere else


def test_a_hanging_exporter_times_out(serve: Callable[[Behaviour], str]) -> None:
    with pytest.raises(SourceError, match="timed out"):
        DcgmSource(serve(Behaviour(hang=True)), timeout_s=0.2).read()


@pytest.mark.parametrize(
    ("behaviour", "message"),
    [
        (Behaviour(body=b"#" * 5000), "5000 bytes is larger than the limit of 4096"),
        (Behaviour(body=b"#" * 5000, send_length=False), "larger than the limit of 4096"),
        (Behaviour(body=b"#" * 10_000_000, gzip=True), "larger than the limit of 4096"),  # a gzip bomb
    ],
)
def test_a_page_over_the_size_limit_is_refused(
    serve: Callable[[Behaviour], str], behaviour: Behaviour, message: str
) -> None:
    with pytest.raises(SourceError, match=message):
        DcgmSource(serve(behaviour), max_bytes=4096).read()


def test_a_refused_port_is_a_source_error() -> None:
    with pytest.raises(SourceError, match="cannot be reached: connection refused"):
        fetch_url(f"http://127.0.0.1:{free_port()}/metrics", 2.0, max_bytes=1000)


def test_fetch_url_refuses_other_schemes_without_showing_credentials() -> None:
    with pytest.raises(SourceError, match="must look like") as info:
        fetch_url("file://me:pw-456@localhost/etc/passwd", 2.0, max_bytes=1000)
    assert "pw-456" not in str(info.value)


# --- through the exporter: a stand-in dcgm-exporter, the poller and the HTTP server ------------------------------


def test_exporter_over_a_stand_in_page_reports_unusable_pages_and_lost_gpus() -> None:
    two = f"DCGM_FI_DEV_GPU_UTIL{{{ID0}}} 10\nDCGM_FI_DEV_GPU_UTIL{{{ID1}}} 20\n"
    with stand_in_dcgm_exporter("# HELP go_goroutines x\ngo_goroutines 12\n") as dcgm:
        poller = Poller(DcgmSource(dcgm.url, node="n1"), interval_s=60.0)
        server = exporter_server(Routes(single=poller), host="127.0.0.1", port=0)
        server.start()
        healthz = f"http://127.0.0.1:{server.port}/healthz"
        metrics = f"http://127.0.0.1:{server.port}/metrics"
        try:
            poller.collect_once()
            status, _, body = http_get(healthz)
            assert status == 503
            assert "no GPU series on the page (1 samples, e.g. 'go_goroutines')" in json.loads(body)["reason"]
            dcgm.serve(two)
            poller.collect_once()
            assert http_get(healthz)[0] == 200
            dcgm.serve(f"DCGM_FI_DEV_GPU_UTIL{{{ID0}}} 10\n")  # GPU 1 vanishes
            poller.collect_once()
            text = http_get(metrics)[2].decode()
            assert f'gpulens_gpu_up{{node="n1",gpu="1",uuid="{GPU1}"' in text
            up = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith("gpulens_gpu_up{")]
            assert sorted(up) == ["0", "1"]
            assert 'gpulens_exporter_collect_errors_total{reason="dcgm_gpu_missing"} 1' in text
        finally:
            server.close()


def test_values_storage_cannot_hold_are_dropped_alone_and_counted_by_reason() -> None:
    page = (
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="40000",UUID="GPU-far"}} 40\n'
        f"DCGM_FI_DEV_GPU_TEMP{{{ID0}}} 41\n"
        f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{ID0}}} 5e9\n"
    ).encode()
    snapshot = DcgmSource("http://127.0.0.1:9400/metrics", node="n", fetch=lambda url, timeout: page).read()
    assert snapshot.errors == {"dcgm_gpu_index_out_of_range": 1, "dcgm_value_out_of_range": 1}
    [gpu] = snapshot.gpus
    assert (gpu.uuid, gpu.temperature_celsius, gpu.nvlink_crc_flit_errors_total) == (GPU0, 41.0, None)
