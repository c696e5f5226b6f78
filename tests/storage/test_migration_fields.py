"""``fields_at``: the GPU sample fields as of a revision, which the migrations build the SI views from.

The newest revision's fields must be today's stored fields: a field added to the catalogue (and so to the tables)
without a migration that adds its column and shows it in the views fails here.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic.script import ScriptDirectory

from gpulens.storage import schema, views
from gpulens.storage.db import MIGRATIONS_DIR, Database
from gpulens.storage.migrations.fields import fields_at
from gpulens.storage.schema import StoredField

SCRIPT = ScriptDirectory(str(MIGRATIONS_DIR))


def _meaning(f: StoredField) -> tuple[object, ...]:
    """What a view makes of a field (the SQL type is the table's business, not the view's)."""
    return (f.column, f.kind, f.unit, f.per_unit, f.is_bool, f.is_int, f.profile)


def test_the_newest_revision_has_every_stored_field() -> None:
    head = {f.name: _meaning(f) for f in fields_at("head", SCRIPT)}
    assert head == {f.name: _meaning(f) for f in schema.SAMPLE_FIELDS}


def test_each_revision_changes_the_fields_it_says_it_changes() -> None:
    assert fields_at("0002", SCRIPT) == []  # no SI views before 0003
    at_0003 = fields_at("0003", SCRIPT)
    assert "power_watts" in [f.name for f in at_0003]
    assert fields_at("0004", SCRIPT) == at_0003  # 0004 narrows types only
    at_0005 = fields_at("0005", SCRIPT)
    assert at_0005[: len(at_0003)] == at_0003
    assert [f.name for f in at_0005[len(at_0003) :]] == ["encoder_utilization_ratio", "decoder_utilization_ratio"]
    assert not any(f.profile for f in fields_at("0007", SCRIPT))
    at_0008 = fields_at("0008", SCRIPT)
    assert {f.name for f in at_0008 if f.profile} == set(schema.PROFILE_FIELDS)
    assert [f.name for f in at_0008] == [f.name for f in at_0005]


def test_the_views_of_an_upgraded_store_show_the_newest_fields(db: Database) -> None:
    inspector = sa.inspect(db.engine)
    columns = {c["name"] for c in inspector.get_columns(views.VIEWS["gpu_sample"])}
    assert {f.name for f in fields_at("head", SCRIPT)} <= columns
    rollup = {c["name"] for c in inspector.get_columns(views.VIEWS["gpu_rollup_1m"])}
    assert "encoder_utilization_ratio_mean" in rollup
