"""Shared fixtures. Required external tools (promtool, prometheus) fail loudly when missing: no silent skips."""

from __future__ import annotations

import shutil
import socket
import urllib.request

import pytest


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run .ci/run (or apt-get install prometheus) before the tests")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_tool("promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return require_tool("prometheus")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, *, headers: dict[str, str] | None = None, timeout: float = 10, context: object = None):
    """(status, headers, body) for a GET, without raising on HTTP error statuses."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:  # type: ignore[arg-type]
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        body = err.read()
        err.close()
        return err.code, dict(err.headers), body
