"""A live exporter on 127.0.0.1 for the collector's reliability tests: each scrape is a new reading, stamped now.

Every request gets a fresh two-GPU snapshot with the current time (so each round stores new rows); the GPUs'
temperature alternates between hot and cool from one scrape to the next, so an alert rule on it changes state (and
notifies) every round; or, given a ``Fault``, is hot while the test holds the fault on.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from gpulens.snapshotcodec import snapshot_to_json
from tests.fakes.static_source import node_snapshot

GPUS = 2


class Fault:
    """A fault the test switches: the exporter's GPUs read hot while ``on``."""

    def __init__(self) -> None:
        self.on = False

    def __iter__(self) -> Iterator[bool]:
        return self

    def __next__(self) -> bool:
        return self.on


class _Live(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        server: _Server = self.server  # type: ignore[assignment]
        hot = next(server.flips)
        base = node_snapshot(server.node, gpus=GPUS, t=round(time.time(), 3))
        gpus = tuple(dataclasses.replace(g, temperature_celsius=95.0 if hot else 50.0) for g in base.gpus)
        body = orjson.dumps(snapshot_to_json(base.replace(gpus=gpus)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    flips: Iterator[bool]
    node: str

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A collector that goes away mid-scrape is expected."""


@contextmanager
def live_exporter(fault: Fault | None = None, node: str = "node-00") -> Iterator[str]:
    server = _Server(("127.0.0.1", 0), _Live)
    server.node = node
    server.flips = fault if fault is not None else itertools.cycle((True, False))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
