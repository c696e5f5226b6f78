"""Remediation across an HA failover, against the real Slurm: two ``gpulens alerts run`` processes over one
PostgreSQL store with a live slurm-drain action; the GPUs of the Slurm node run hot (a rule the action lists), the
active process drains the node and is killed with SIGKILL; the standby takes over, keeps the node drained while the
fault lasts, and resumes it when every GPU's alert has resolved, and not before."""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from contextlib import ExitStack
from pathlib import Path

from gpulens.collector.loop import Collector
from gpulens.settings import TargetSettings, default_settings
from gpulens.storage import remediationstore
from gpulens.storage.db import Database
from gpulens.storage.slurmtables import recent_drain_actions
from tests.collector.live import GPUS, Fault, live_exporter
from tests.collector.test_pair_kill import until
from tests.slurm.conftest import Slurm
from tests.storage.conftest import PgServer, _pg_root, pg_server  # noqa: F401 -- the fixtures this test uses
from tests.storage.promstack import gpulens, process

CONFIG = """
[[targets]]
name = "{node}"
url = "{exporter}"

[alerts.builtin.Watchdog]
enabled = false

[[alerts.rules]]
name = "GpuHot"
field = "temperature_celsius"
op = ">="
threshold = 80
for = "0s"

[[alerts.actions]]
kind = "slurm-drain"
rules = ["GpuHot"]
dry_run = false
resume_on_resolve = true
"""


def test_the_standby_resumes_the_node_when_the_fault_resolves_and_not_before(
    slurm: Slurm,
    pg_server: PgServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    url = pg_server.url(pg_server.create_database(migrated=True))
    fault = Fault()
    db = Database(url)
    with ExitStack() as stack:
        stack.callback(db.close)
        exporter = stack.enter_context(live_exporter(fault, node=slurm.host))
        settings = dataclasses.replace(
            default_settings(environ={}),
            db_url=url,
            targets=(TargetSettings(url=exporter, name=slurm.host),),
            interval_s=1.0,
            timeout_s=0.5,
            spool_dir=str(tmp_path / "spool"),
        )
        collector, stop = Collector(settings, db), threading.Event()  # the rounds, from a collector without rules
        writing = threading.Thread(target=collector.run, args=(stop,))
        writing.start()
        stack.callback(collector.close)
        stack.callback(writing.join, 30)
        stack.callback(stop.set)
        config = tmp_path / "gpulens.toml"
        config.write_text(CONFIG.format(node=slurm.host, exporter=exporter))
        members = []
        for i in range(2):
            log = tmp_path / f"rules{i}.log"
            proc = gpulens("alerts", "run", "--config", str(config), "--db", url, "--interval", "1s", log=log)
            stack.enter_context(process(proc, log))
            members.append((proc, log))
        logs = [log for _, log in members]
        said = lambda line: [line in log.read_text() for log in logs]  # noqa: E731
        until("one active, one on standby", lambda: any(said("is on standby")) and any(said("now the active")), logs)
        (killed, _), (survivor, survivor_log) = sorted(members, key=lambda m: "is on standby" in m[1].read_text())

        fault.on = True
        until("the node drains", lambda: "drain" in slurm.node_state(), logs)
        until("every GPU holds it", lambda: len(remediationstore.causes(db).get(slurm.host, [])) == GPUS, logs)
        assert slurm.node_reason().startswith("gpulens: ")
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        until("the standby takes over", lambda: "is now the active one" in survivor_log.read_text(), logs)
        taken_over = time.time()
        until("three rounds on the standby", lambda: collector_rounds_after(db, taken_over) >= 3, logs)
        assert "drain" in slurm.node_state()  # the fault lasts: not before

        fault.on = False
        until("the node resumes", lambda: "drain" not in slurm.node_state(), logs)
        outcomes = [(r["step"], r["outcome"]) for r in reversed(recent_drain_actions(db))]
        assert outcomes == [("drain", "drained"), ("drain", "joined"), ("resume", "kept"), ("resume", "resumed")]
        assert survivor.poll() is None
        assert all("Traceback" not in log.read_text() for log in logs)


def collector_rounds_after(db: Database, since: float) -> int:
    from tests.collector.test_pair_kill import round_times

    return sum(t > since for t in round_times(db))
