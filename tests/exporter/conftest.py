"""Fixtures shared by the exporter's tests: a stand-in kubelet serving the pod-resources API on a unix socket."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gpulens.exporter.podresources import api_pb2_grpc
from tests.exporter.test_podresources import Kubelet


@pytest.fixture
def kubelet() -> Iterator[tuple[Kubelet, str]]:
    # A short directory: a unix socket path must fit in 108 bytes, which pytest's tmp_path may not.
    socket_dir = Path("/tmp/k8s30b") if Path("/tmp/k8s30b").is_dir() else Path("/tmp")
    path = str(socket_dir / f"kubelet-{id(object())}.sock")
    servicer = Kubelet()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    assert server.add_insecure_port(f"unix://{path}") == 1
    server.start()
    try:
        yield servicer, path
    finally:
        server.stop(None).wait()
        Path(path).unlink(missing_ok=True)
