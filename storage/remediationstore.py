"""What remediation remembers across restarts and HA failovers: the nodes it drained, why, since when, and its brake.

* ``remediation_node``: one row per node a remediation action ever drained (or would have, in a dry run): the action,
  the Slurm reason it set, when it last drained the node (the cooldown counts from it) and whether it holds the node
  drained now (``held``). A row stays after the node is resumed, so the cooldown outlives the process.
* ``remediation_cause``: the node-to-reasons map: each open incident or alert (``cause``) that holds a node drained.
  A node is resumed only when its last cause is gone.
* ``remediation_halt``: the brake's halts, newest last; one without ``lifted_at`` halts every action until
  ``gpulens remediation resume`` lifts it.

The tables are defined beside the audit ``drain_action`` in ``storage.slurmtables``; the decisions themselves
(taken, dry-run, refused, failed) are the audit's rows. Every function runs in its own transaction; the active
collector of an HA pair is the only writer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from gpulens.storage.slurmtables import drain_action, remediation_cause, remediation_halt, remediation_node

if TYPE_CHECKING:
    from gpulens.storage.db import Database


@dataclass(frozen=True)
class NodeHold:
    """A node remediation drained: the action, the reason it gave Slurm, when, whether it still holds it."""

    node: str
    action: str
    reason: str
    drained_at: float
    held: bool
    dry_run: bool


@dataclass(frozen=True)
class Halt:
    halted_at: float
    reason: str


def node_hold(db: Database, node: str) -> NodeHold | None:
    """What remediation remembers of ``node`` (None: it never drained it)."""
    with db.session() as s:
        row = s.execute(sa.select(remediation_node).where(remediation_node.c.node == node)).mappings().first()
    return None if row is None else NodeHold(**row)


def held_nodes(db: Database) -> dict[str, NodeHold]:
    """The nodes remediation holds drained now (in a dry run: would hold)."""
    with db.session() as s:
        rows = s.execute(sa.select(remediation_node).where(remediation_node.c.held)).mappings().all()
    return {r["node"]: NodeHold(**r) for r in rows}


def hold(db: Database, hold_: NodeHold, cause: str, summary: str) -> None:
    """Remember that remediation drained ``hold_.node`` for ``cause`` (insert or replace the node's row)."""
    with db.write_transaction() as conn:
        conn.execute(sa.delete(remediation_node).where(remediation_node.c.node == hold_.node))
        conn.execute(sa.insert(remediation_node).values(**asdict(hold_)))
        _add_cause(conn, hold_.node, cause, hold_.action, hold_.drained_at, summary)


def add_cause(db: Database, node: str, cause: str, action: str, now: float, summary: str) -> bool:
    """Add ``cause`` to the node's open causes; False where it was there already (a retry)."""
    with db.write_transaction() as conn:
        return _add_cause(conn, node, cause, action, now, summary)


def _add_cause(conn: Any, node: str, cause: str, action: str, now: float, summary: str) -> bool:
    key = (remediation_cause.c.node == node) & (remediation_cause.c.cause == cause)
    if conn.execute(sa.select(remediation_cause.c.cause).where(key)).first() is not None:
        return False
    conn.execute(
        sa.insert(remediation_cause).values(node=node, cause=cause, action=action, opened_at=now, summary=summary)
    )
    return True


def has_cause(db: Database, node: str, cause: str) -> bool:
    with db.session() as s:
        key = (remediation_cause.c.node == node) & (remediation_cause.c.cause == cause)
        return s.execute(sa.select(remediation_cause.c.cause).where(key)).first() is not None


def drop_cause(db: Database, node: str, cause: str) -> list[str] | None:
    """Close ``cause`` on ``node``: the causes still open there, or None where it was not open (a retry)."""
    with db.write_transaction() as conn:
        key = (remediation_cause.c.node == node) & (remediation_cause.c.cause == cause)
        if conn.execute(sa.delete(remediation_cause).where(key)).rowcount == 0:
            return None
        rest = conn.execute(sa.select(remediation_cause.c.cause).where(remediation_cause.c.node == node)).scalars()
        return sorted(rest)


def causes(db: Database) -> dict[str, list[dict[str, Any]]]:
    """Node -> its open causes (cause, action, opened_at, summary), oldest first."""
    with db.session() as s:
        rows = s.execute(sa.select(remediation_cause).order_by(remediation_cause.c.opened_at)).mappings().all()
    found: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        found.setdefault(r["node"], []).append({k: r[k] for k in ("cause", "action", "opened_at", "summary")})
    return found


def release(db: Database, node: str) -> None:
    """The node is no longer held (resumed, or taken over by someone else); its cooldown row stays."""
    with db.write_transaction() as conn:
        conn.execute(sa.update(remediation_node).where(remediation_node.c.node == node).values(held=False))
        conn.execute(sa.delete(remediation_cause).where(remediation_cause.c.node == node))


def nodes_wanted_since(db: Database, since: float, outcomes: tuple[str, ...]) -> set[str]:
    """The nodes with a drain decision of one of ``outcomes`` since ``since`` (what the brake counts)."""
    with db.session() as s:
        rows = s.execute(
            sa.select(drain_action.c.node)
            .where(drain_action.c.time >= since, drain_action.c.step == "drain", drain_action.c.outcome.in_(outcomes))
            .distinct()
        ).scalars()
        return set(rows)


def current_halt(db: Database) -> Halt | None:
    """The brake's halt in force, or None."""
    with db.session() as s:
        row = (
            s.execute(
                sa.select(remediation_halt)
                .where(remediation_halt.c.lifted_at.is_(None))
                .order_by(remediation_halt.c.id.desc())
            )
            .mappings()
            .first()
        )
    return None if row is None else Halt(row["halted_at"], row["reason"])


def halt(db: Database, now: float, reason: str) -> None:
    """Halt every remediation action (nothing where a halt is in force already)."""
    with db.write_transaction() as conn:
        if conn.execute(sa.select(remediation_halt.c.id).where(remediation_halt.c.lifted_at.is_(None))).first():
            return
        conn.execute(sa.insert(remediation_halt).values(halted_at=now, reason=reason))


def lift_halt(db: Database, now: float, by: str) -> Halt | None:
    """Lift the halt in force (a person's decision); the halt lifted, or None where none was in force."""
    found = current_halt(db)
    if found is None:
        return None
    with db.write_transaction() as conn:
        conn.execute(
            sa.update(remediation_halt)
            .where(remediation_halt.c.lifted_at.is_(None))
            .values(lifted_at=now, lifted_by=by)
        )
    return found


def remediation_state(db: Database) -> dict[str, Any]:
    """What the Remediation page and ``gpulens remediation list`` show besides the audit: the halt in force (or
    None) and each node held with its open causes."""
    found = current_halt(db)
    open_causes = causes(db)
    held = [{**asdict(h), "causes": open_causes.get(node, [])} for node, h in sorted(held_nodes(db).items())]
    return {"halt": None if found is None else asdict(found), "held": held}
