"""Rules run once over the whole cluster: two sharded collectors writing one PostgreSQL, a job spanning both shards
that stalls, and exactly one CommunicationStall delivered (the collector holding the advisory lock runs the rules
over every GPU in the store; the other leaves them to it)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import sqlalchemy as sa

from gpulens.collector.targets import shard_of
from gpulens.storage.db import Database
from tests.conftest import free_port
from tests.storage.conftest import PgServer
from tests.storage.promstack import NODES, SCENARIO, SPEED, Hook, fired, gpulens, process, wait_http

CONFIG = """
[collector]
interval = "1s"
listen = "127.0.0.1:{listen}"
spool_dir = "{spool}"

[alerts.builtin.CommunicationStall]
for = "3s"

[[alerts.receivers]]
name = "hook"
kind = "webhook"
url_env = "HOOK_URL"

[[alerts.routes]]
receiver = "hook"
group_wait = "0s"
{targets}
"""
STALL_AT = "3m"  # 18 s after the exporter starts, at its speed


@pytest.fixture
def receiver() -> Iterator[str]:
    Hook.payloads = {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/shared"
    server.shutdown()
    server.server_close()


def target_names() -> dict[str, str]:
    """A target name per node such that the two nodes fall in different shards of two."""
    names: dict[str, str] = {}
    for node, wanted in zip(NODES, (0, 1), strict=True):
        names[node] = next(f"{node}-{i}" for i in range(100) if shard_of(f"{node}-{i}", 2) == wanted)
    return names


def test_two_shards_and_a_job_spanning_both_raise_one_stall(pg_server: PgServer, receiver: str, tmp_path: Path) -> None:
    name = pg_server.create_database()
    url = pg_server.url(name)
    scenario = tmp_path / "stall.toml"
    scenario.write_text(
        SCENARIO.format(nodes=list(NODES), seed=7, a=NODES[0], b=NODES[1], job="llm-pretrain")
        .replace("'", '"')
        .replace('at = "6m"', f'at = "{STALL_AT}"')
    )
    assert f'at = "{STALL_AT}"' in scenario.read_text()
    port = free_port()
    log = tmp_path / "exporter.log"
    names = target_names()
    targets = "".join(
        f'\n[[targets]]\nname = "{names[n]}"\nurl = "http://127.0.0.1:{port}/node/{n}"\nnode = "{n}"\n' for n in NODES
    )
    try:
        with closing(Database(url)) as db:
            db.upgrade()  # once, before the two collectors start
        with ExitStack() as running:  # each process stopped at the end, however the test ends
            collectors = []
            for shard in (0, 1):
                config = tmp_path / f"shard{shard}.toml"
                config.write_text(CONFIG.format(listen=free_port(), spool=tmp_path / f"spool{shard}", targets=targets))
                clog = tmp_path / f"collector{shard}.log"
                proc = gpulens(
                    "collector", "--config", str(config), "--db", url, "--shard", f"{shard}/2",
                    env={"HOOK_URL": receiver}, log=clog,
                )  # fmt: skip
                running.enter_context(process(proc, clog))
                collectors.append((proc, clog))
            # The exporter (and its clock) starts last: the collectors already run, so the rules have the whole 18 s
            # before the stall to learn the job's baseline (6 rounds of 1 s are enough).
            exporter = gpulens(
                "exporter", "--source", "sim", "--scenario", str(scenario), "--all-nodes", "--speed", str(SPEED),
                "--listen", f"127.0.0.1:{port}", log=log,
            )  # fmt: skip
            running.enter_context(process(exporter, log))
            wait_http(f"http://127.0.0.1:{port}/api/v1/nodes", exporter, log)
            deadline = time.monotonic() + 150
            while not fired("/shared", "CommunicationStall") and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(5)  # five more rounds: a second engine would have notified by now
            logs = "\n".join(path.read_text()[-1500:] for _, path in collectors)
            alerts = fired("/shared", "CommunicationStall")
            assert len(alerts) == 1, logs
            assert alerts[0]["labels"]["job_id"] == "llm-pretrain"
            with closing(Database(url)) as db, db.session() as session:
                rows = session.execute(
                    sa.text("SELECT count(*) FROM alert_history WHERE rule = 'CommunicationStall' AND state = 'firing'")
                ).scalar()
            assert rows == 1
            assert all(p.poll() is None for p, _ in collectors)
    finally:
        pg_server.drop_database(name)
