"""A snapshot the database refuses costs only itself: the writer's last line behind the checks at the door.

The readers drop what storage cannot hold (tests/collector/test_hostile_target.py); a snapshot that reaches the
writer anyway (a GPU index 40000: PostgreSQL's smallint refuses it; an integer over 64 bits: sqlite3 refuses it) is
dropped alone, named in ``WriteStats.isolated`` and logged once, and the round's other snapshots and the targets'
health are stored, round after round.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
import sqlalchemy as sa

from gpulens.model import ProcessReading, TargetHealth
from gpulens.storage.db import Database
from gpulens.storage.writer import Writer
from tests.storage.data import snapshot

T0 = 1_750_000_000.0


def hostile(t: float):  # type: ignore[no-untyped-def]
    base = snapshot("bad", t)
    first, second = base.gpus
    process = ProcessReading("bad", 0, first.uuid, 2**64, 1024, "python", "mallory", None)
    return base.replace(gpus=(first, dataclasses.replace(second, gpu=40000)), processes=(process,))


def test_a_refused_snapshot_is_isolated_and_the_round_stored(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    writer = Writer(db)
    caplog.set_level(logging.WARNING, logger="gpulens.storage.writer")
    for i in range(3):
        t = T0 + 10 * i
        health = [
            TargetHealth("good", "http://good", "gpulens", t, True),
            TargetHealth("bad", "http://b", "gpulens", t, True),
        ]
        stats = writer.write([snapshot("good", t), hostile(t), snapshot("also-good", t)], health)
        assert stats.isolated == ["bad"]
        assert stats.gpu_rows == 4
        assert stats.target_rows == 2
    with db.engine.connect() as conn:
        rows = dict(
            conn.execute(
                sa.text("SELECT g.node, count(*) FROM gpu_sample s JOIN gpu g ON g.id = s.gpu_id GROUP BY g.node")
            ).all()
        )
        targets = conn.execute(sa.text("SELECT count(*) FROM target_health")).scalar_one()
    assert rows == {"good": 6, "also-good": 6}
    assert targets == 2
    refused = [r for r in caplog.records if "refused its snapshot" in r.getMessage()]
    assert len(refused) == 1  # logged once, not every round
    assert "\n" not in refused[0].getMessage()


def test_a_round_that_fits_is_one_transaction(db: Database) -> None:
    stats = Writer(db).write([snapshot("good", T0), snapshot("also-good", T0)])
    assert (stats.gpu_rows, stats.isolated) == (4, [])
