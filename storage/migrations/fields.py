"""The GPU sample fields as of a revision: what the SI views of that revision show, for the migrations to build them.

The SI views (``gpulens.storage.views``) are created by the migrations, each from the fields of its own revision,
never from today's catalogue: an old revision must keep building the views of its time. Each revision that changes
the sample fields (adds one, renames its column, moves it to ``gpu_profile``) says how, in a module-level function

    def change_sample_fields(before: list[StoredField]) -> list[StoredField]: ...

which takes the fields as the revision before left them and returns them as this one leaves them, from values frozen
in the revision itself. ``fields_at(revision)`` applies those functions in order from the first revision to
``revision``. A migration that drops and creates the views again calls ``fields_at(revision)`` in ``upgrade()`` and
``fields_at(down_revision)`` in ``downgrade()``; ``v0005_codec_utilization.py`` is the model for adding a field.
"""

from __future__ import annotations

from alembic import op
from alembic.script import ScriptDirectory

from gpulens.storage.schema import StoredField

HOOK = "change_sample_fields"  # the function a revision defines when it changes the sample fields


def fields_at(revision: str, script: ScriptDirectory | None = None) -> list[StoredField]:
    """The GPU sample fields as revision ``revision`` leaves them (empty before the first revision that has any).

    ``script``: the migrations' directory; by default the one running the current migration (``op``'s context).
    """
    if script is None:
        script = _running_script()
    history = list(script.iterate_revisions(revision, "base"))  # newest first
    fields: list[StoredField] = []
    for step in reversed(history):
        change = getattr(step.module, HOOK, None)
        if change is not None:
            fields = change(list(fields))
    return fields


def _running_script() -> ScriptDirectory:
    context = op.get_context()
    if context.script is not None:  # the directory alembic is running from: its modules are loaded already
        return context.script
    config = context.config
    if config is None:  # pragma: no cover (Database.upgrade always passes a config)
        raise RuntimeError("fields_at() outside a migration needs the script directory")
    return ScriptDirectory.from_config(config)
