"""NCCL RAS's MONITOR stream (2.29+), over TCP on private ports of 127.0.0.1: events read in text and JSON, a hostile
stream survived within its bounds, a dead peer's rank in the view at the collection after its event, and the
status queries in turns going on when the stream ends."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from gpulens.clock import ManualClock
from gpulens.exporter import ncclmonitor
from gpulens.exporter.ncclmonitor import (
    MAX_EVENTS_PER_S,
    MAX_LINE,
    EventParser,
    Monitor,
    MonitorError,
    MonitorEvent,
    connect_monitor,
)
from gpulens.exporter.ncclras import NcclRasReader
from gpulens.exporter.sim.rasserver import MonitorFeed, RasServer, RasState, SimComm, SimRank, render_event
from gpulens.logutil import ErrorCounter
from gpulens.ncclmodel import RANK_DEAD, RANK_OK, RANK_UNRESPONSIVE
from tests.exporter.rasanswers import FIRST_PID, JOB, LOCAL_HOST, node_snapshot

PEER = (LOCAL_HOST, FIRST_PID + 3, 3)


def _state(version: str = "2.29.2") -> RasState:
    ranks = [SimRank(r, LOCAL_HOST, FIRST_PID + r, r, {"AllReduce": 100}) for r in range(8)]
    return RasState(version, [SimComm(0xABC, ranks)], job=JOB)


class RawServer:
    """Answers the MONITOR handshake, then sends ``payload`` (bytes, sent ``repeat`` times) and closes."""

    def __init__(self, payload: bytes, repeat: int = 1) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self._payload, self._repeat = payload, repeat
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self._sock.accept()
        except OSError:
            return
        with conn:
            reader = conn.makefile("rb")
            try:
                for answer in (b"SERVER PROTOCOL 2\n", b"OK\n", b"OK\n"):
                    reader.readline()
                    conn.sendall(answer)
                for _ in range(self._repeat):
                    conn.sendall(self._payload)
            except OSError:
                return

    def close(self) -> None:
        self._sock.close()
        self._thread.join(timeout=10)


@pytest.fixture
def raw() -> Iterator[list[RawServer]]:
    servers: list[RawServer] = []
    yield servers
    for s in servers:
        s.close()


def _read_all(monitor: Monitor, most: int = 10_000) -> None:
    """Reads the stream until it ends (the raw servers close after their payload)."""
    for _ in range(most):
        monitor.poll(5.0)
        if not monitor.open:
            return
    raise AssertionError("the stream never ended")


def test_text_and_json_events_are_read_whatever_the_chunks() -> None:
    text = render_event("PEER_DEAD", PEER, json=False) + render_event("PEER_RECOVERED", PEER, json=False)
    jsn = render_event("PEER_UNRESPONSIVE", PEER, json=True)
    data = (text + jsn).encode()
    parser = EventParser()
    got = [e for i in range(0, len(data), 7) for e in parser.feed(data[i : i + 7])]
    want = MonitorEvent("PEER_DEAD", LOCAL_HOST, FIRST_PID + 3, (3,))
    assert got == [
        want,
        MonitorEvent("PEER_RECOVERED", *PEER[:2], (3,)),
        MonitorEvent("PEER_UNRESPONSIVE", *PEER[:2], (3,)),
    ]
    addr_only = EventParser().feed(b'{"event": "PEER_DEAD", "peer": {"addr": "10.0.0.9:28028"}}\n')
    assert addr_only == [MonitorEvent("PEER_DEAD", "10.0.0.9")]


def test_the_simulators_feed_pushes_each_change_once() -> None:
    state = _state()
    feed = MonitorFeed(lambda: state, json=False)
    assert feed.recv(0.0) is None
    state.comms[0].ranks[3].state = RANK_UNRESPONSIVE
    first = feed.recv(0.0)
    assert first is not None
    assert [e for e in EventParser().feed(first)] == [MonitorEvent("PEER_UNRESPONSIVE", *PEER[:2], (3,))]
    assert feed.recv(0.0) is None
    with pytest.raises(MonitorError, match="MONITOR"):
        MonitorFeed(lambda: _state("2.28.7"), json=True)


@pytest.mark.parametrize(
    ("payload", "repeat", "reason"),
    [
        (b"x" * 4096, 64, "nccl_monitor_oversized"),  # an endless line: cut at MAX_LINE, the stream dropped
        (b"{\n" + b'"a": 1,\n' * 600, 1, "nccl_monitor_oversized"),  # an endless JSON object
        (b"garbage \x00\xff line\n", 200, "nccl_monitor_malformed"),
        (render_event("PEER_DEAD", PEER, json=False).encode(), 10 * MAX_EVENTS_PER_S, "nccl_monitor_flood"),
    ],
)
def test_a_hostile_stream_is_read_within_its_bounds(
    raw: list[RawServer], payload: bytes, repeat: int, reason: str
) -> None:
    server = RawServer(payload, repeat)
    raw.append(server)
    errors = ErrorCounter(ncclmonitor.log)
    monitor = Monitor(lambda: connect_monitor(server.addr), ManualClock(), errors)
    _read_all(monitor)
    assert errors[reason] >= 1
    assert monitor.events <= MAX_EVENTS_PER_S  # the clock stood still: one second's worth applied at most
    assert len(monitor._parser._buffer) <= MAX_LINE + 4096
    assert errors["nccl_monitor_ended"] + errors["nccl_monitor_oversized"] == 1  # the stream dropped once


def test_a_dead_peer_is_in_the_view_at_the_next_collection_and_recovers() -> None:
    state = _state()
    server = RasServer(lambda: state)
    clock = ManualClock(1000.0)
    reader = NcclRasReader(server.addr, clock=clock, background=False)
    snap = node_snapshot()
    try:
        reader.enrich(snap)  # the first answer says 2.29.2
        clock.advance(1.0)
        reader.enrich(snap)  # the stream opens
        monitor = reader.monitor
        assert monitor is not None
        assert monitor.open
        state.comms[0].ranks[3].state = RANK_UNRESPONSIVE
        while monitor.events < 1:
            monitor.poll(5.0)
        clock.advance(1.0)
        before = server.status_queries
        view = reader.enrich(snap).nccl
        assert view is not None
        assert {r.rank: r.state for r in view.ranks}[3] == RANK_DEAD
        assert {r.rank for r in view.ranks if r.state != RANK_OK} == {3}
        assert server.status_queries == before + 1  # the event confirmed by a query outside the turn
        state.comms[0].ranks[3].state = RANK_OK
        while monitor.events < 2:
            monitor.poll(5.0)
        view = reader.enrich(snap).nccl
        assert view is not None
        assert all(r.state == RANK_OK for r in view.ranks)
    finally:
        reader.close()
        server.close()


def test_when_the_stream_ends_the_status_turns_go_on_and_it_is_opened_again() -> None:
    state = _state()
    streaming = [True]
    server = RasServer(lambda: state, monitor_state=lambda: state if streaming[0] else None)
    clock = ManualClock(1000.0)
    reader = NcclRasReader(server.addr, clock=clock, background=False)
    snap = node_snapshot()
    try:
        reader.enrich(snap)
        clock.advance(1.0)
        reader.enrich(snap)
        monitor = reader.monitor
        assert monitor is not None
        assert monitor.open
        streaming[0] = False
        while monitor.open:
            monitor.poll(5.0)
        errors = reader.enrich(snap).errors
        assert errors["nccl_monitor_ended"] == 1
        streaming[0] = True
        before = server.status_queries
        for _ in range(20):  # the turns go on, and the stream is tried again after its backoff
            clock.advance(1.0)
            reader.enrich(snap)
        assert server.status_queries > before
        assert monitor.connections == 2
        assert monitor.open
    finally:
        reader.close()
        server.close()


def test_an_older_nccl_gets_no_stream() -> None:
    state = _state("2.28.7")
    server = RasServer(lambda: state)
    clock = ManualClock(1000.0)
    reader = NcclRasReader(server.addr, clock=clock, background=False)
    try:
        for _ in range(3):
            reader.enrich(node_snapshot())
            clock.advance(1.0)
        assert reader.monitor is None
    finally:
        reader.close()
        server.close()
