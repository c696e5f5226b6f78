"""Slurm's job metadata and the slurm-drain audit, stored (SQLite and PostgreSQL)."""

from __future__ import annotations

import dataclasses

from gpulens.alerts.remediationcase import DRY_RUN, DrainRecord
from gpulens.model import JobInfo
from gpulens.storage.db import Database
from gpulens.storage.slurmtables import read_job_info, recent_drain_actions, record_drain_action
from gpulens.storage.writer import Writer
from tests.storage.conftest import T0
from tests.storage.data import snapshot


def test_the_writer_stores_each_jobs_metadata_and_its_changes(db: Database) -> None:
    writer = Writer(db)
    info = JobInfo("n1", "41", "trainer", "alice", "proj1", "gpu", "40", 1, T0 - 60, T0 - 30)
    writer.write([snapshot("n1", T0, job="41").replace(job_info=(info,))])
    assert read_job_info(db, ["41", "42"]) == {"41": info}
    renamed = dataclasses.replace(info, name="trainer-2", partition=None)
    writer.write([snapshot("n1", T0 + 10, job="41").replace(job_info=(renamed,))])
    assert read_job_info(db, ["41"]) == {"41": renamed}


def test_drain_decisions_are_audited_newest_first(db: Database) -> None:
    for i, node in enumerate(("n1", "n2")):
        record_drain_action(db, DrainRecord(T0 + i, "slurm-drain", node, "3", "XidError:79", DRY_RUN, "why"))
    rows = recent_drain_actions(db, limit=5)
    assert [(r["node"], r["outcome"], r["rule"]) for r in rows] == [
        ("n2", DRY_RUN, "XidError:79"),
        ("n1", DRY_RUN, "XidError:79"),
    ]
