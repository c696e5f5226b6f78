"""Shared fixtures. Required external tools (promtool, prometheus) fail loudly when missing: no silent skips."""

from __future__ import annotations

import inspect
import shutil
import socket
import urllib.request

import pytest


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run .ci/run (or apt-get install its package) before the tests")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return require_tool("promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return require_tool("prometheus")


@pytest.fixture(scope="session")
def alertmanager_bin() -> str:
    return require_tool("prometheus-alertmanager")


@pytest.fixture(scope="session")
def victoriametrics_bin() -> str:
    return require_tool("victoria-metrics")


@pytest.fixture(scope="session")
def vmalert_bin() -> str:
    return require_tool("vmalert")  # in Debian's victoria-metrics package


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


# --- the `external` mark: what `make test-fast` leaves out ----------------------------------------------------------

# Fixtures that start or run a program outside Python; a test that needs one, at any depth, is external.
_EXTERNAL_FIXTURES = frozenset(
    {
        "pg_server",
        "private_pg_server",
        "promtool",
        "prometheus_bin",
        "alertmanager_bin",
        "victoriametrics_bin",
        "vmalert_bin",
        "browser",
    }
)
# Calls in a test's own body that do the same.
_EXTERNAL_CALLS = ("chromium(", "require_tool(", "running_prometheus(", "pg_server", "promtool", "Stack(")
# Whole folders whose tests run deployment tools or the whole stack.
_EXTERNAL_FOLDERS = ("deploy", "e2e")


def _is_external(item: pytest.Item) -> bool:
    if _EXTERNAL_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "postgresql" in callspec.params.values():
        return True
    path = item.path
    if path.parent.name in _EXTERNAL_FOLDERS:
        return True
    function = getattr(item, "function", None)
    if function is None:
        return False
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return False
    return any(call in source for call in _EXTERNAL_CALLS)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _is_external(item):
            item.add_marker(pytest.mark.external)


# --- what the session started outside the tests' own fixtures -------------------------------------------------------


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Stop the one-node Slurm that tests/slurm started (its slurmctld, slurmd and munged), once every worker is
    done: the controller process, not a worker (xdist's workers share it, and one finishing early must not stop it).
    Then fail the run if any process it started is still running (``tests.leftovers``)."""
    if hasattr(session.config, "workerinput"):
        return
    from tests.leftovers import leftover_processes
    from tests.slurm.stop import slurm_dir, stop_test_slurm

    stop_test_slurm()
    folders = [slurm_dir(), session.config._tmp_path_factory.getbasetemp()]
    left = leftover_processes(folders)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"the test run left {len(left)} process(es) running: {', '.join(left)}"
        if reporter is not None:
            reporter.write_line(message, red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
