"""The ``slurm-drain`` action: take a node with a failing GPU out of Slurm's service, and only what is its own.

It is a notifier (``[[alerts.actions]]`` with ``kind = "slurm-drain"``) run by the notification worker; each alert
of a listed rule becomes a ``RemediationCase`` (``alerts.remediationcase``). Its memory is the store
(``storage.remediationstore``), so a restart or an HA failover continues where the last process stopped. It is safe
by default and in every step:

- ``dry_run`` (true by default) decides and records, and runs nothing;
- a verdict of ``check-application`` or ``none`` never drains (the application's fault, not the node's);
- a node name is exactly one node of ``sinfo``'s list, never a host list (``alerts.slurmnodes.refuse_name``);
- a node listed in ``exclude_nodes`` or with a feature in ``exclude_features`` is opted out;
- a node that is down, or drained with another reason, is left alone;
- a node is drained at most once per ``cooldown``, and at most ``max_drained_fraction`` of the nodes are drained by
  gpulens at once (nodes drained by others do not count);
- the brake: more than ``breaker_nodes`` of the nodes wanted drained within ``breaker_window`` (drained, or refused
  by the cap) halts every action until ``gpulens remediation resume``;
- it drains with the reason ``gpulens: <case id> <culprit>``; the node's causes are kept, and with
  ``resume_on_resolve`` it is resumed when the last of them resolves, only if Slurm still shows it drained with
  gpulens's reason. A resume runs while halted: the brake stops nodes leaving service, never their return.
- ``requeue`` (off by default) requeues the jobs of the case's blast radius after a drain.

Every decision, taken or refused, is a row of the audit (``drain_action``); a retry of a notification repeats nothing
(a case already holding its node is skipped silently).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpulens.alerts import remediationcase as rc
from gpulens.alerts.notify import DeliveryError
from gpulens.alerts.remediationcase import DrainRecord, RemediationCase
from gpulens.alerts.slurmnodes import (
    OURS,
    SLURM_JOB_ID,
    Runner,
    SlurmNode,
    drain_argv,
    read_nodes,
    refuse_name,
    requeue_argv,
    resume_argv,
    run_command,
)
from gpulens.alerts.state import AlertState
from gpulens.logutil import ErrorCounter
from gpulens.storage import remediationstore as store
from gpulens.storage.db import Database
from gpulens.storage.slurmtables import record_drain_action

logger = logging.getLogger(__name__)

DRAIN_KIND: Final = "slurm-drain"
# GpuLost, the XIDs that mean the GPU must leave service, and uncorrectable ECC errors or a failed row remap.
DEFAULT_RULES: Final = (
    "GpuLost",
    "XidError:48",
    "XidError:79",
    "XidError:94",
    "XidError:95",
    "XidError:119",
    "EccUncorrectable",
)
# What the brake counts: the nodes gpulens drained, would drain (dry run), or wanted to drain but for the cap.
_WANTED: Final = (rc.DRAINED, rc.DRY_RUN, rc.REFUSED_FRACTION)
_PLAIN: Final = (rc.DRAINED, rc.RESUMED, rc.REQUEUED, rc.RAN)  # said without their reason in a message


@dataclass(frozen=True)
class DrainConfig:
    name: str = DRAIN_KIND
    rules: tuple[str, ...] = DEFAULT_RULES
    dry_run: bool = True
    max_drained_fraction: float = 0.05
    cooldown_s: float = 3600.0
    resume_on_resolve: bool = False
    requeue: bool = False
    exclude_nodes: tuple[str, ...] = ()
    exclude_features: tuple[str, ...] = ()
    breaker_nodes: float = 0.10
    breaker_window_s: float = 600.0
    scontrol: str = "scontrol"
    sinfo: str = "sinfo"
    timeout_s: float = 10.0


class SlurmDrainer:
    """The ``slurm-drain`` notifier over ``db``. ``run`` runs a command (raising ``OSError``); ``clock`` is
    wall-clock seconds."""

    def __init__(
        self,
        config: DrainConfig,
        db: Database,
        *,
        run: Runner = run_command,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = config.name
        self._config = config
        self._db = db
        self._run = run
        self._clock = clock
        self._lock = threading.Lock()
        self.refusals = ErrorCounter(logger)  # refused decisions by outcome (the first of each is logged)
        self.records: list[DrainRecord] = []  # this process's decisions, newest last (bounded)

    def send(
        self,
        alerts: Sequence[AlertState],
        *,
        group_labels: Mapping[str, str],
        status: str,
        group_key: str = "",
        incidents: Sequence[Mapping[str, str]] = (),
    ) -> None:
        """Act on each alert of a listed rule. Raises a retryable ``DeliveryError`` when Slurm's commands failed."""
        cases = rc.cases_from_notification(alerts, group_labels, status, group_key, self._config.rules)
        self.act(cases)

    def act(self, cases: Sequence[RemediationCase]) -> None:
        """Act on each case (an open one drains, a resolved one may resume); the seam for incidents."""
        failures: list[str] = []
        with self._lock:
            nodes: dict[str, SlurmNode] | None = None
            for case in cases:
                try:
                    if nodes is None:
                        nodes = read_nodes(self._run, self._config.sinfo, self._config.timeout_s)
                    if case.firing:
                        self._open(case, nodes)
                    else:
                        self._close(case, nodes)
                except OSError as exc:
                    self._record(case, rc.FAILED, str(exc), rc.DRAIN if case.firing else rc.RESUME)
                    failures.append(str(exc))
                    nodes = None  # read again: a command failed half-way
        if failures:
            raise DeliveryError(f"slurm-drain {self.name}: {failures[0]}", retryable=True)

    # --- an open case: drain ---------------------------------------------------------------------------------------

    def _open(self, case: RemediationCase, nodes: dict[str, SlurmNode]) -> None:
        refusal = refuse_name(case.node, nodes)
        if refusal:
            self._refuse(case, rc.REFUSED_NODE_NAME if case.node else rc.REFUSED_NO_NODE, refusal)
            return
        node = nodes[case.node]
        if store.has_cause(self._db, node.name, case.case_id):
            return  # a retry of a case already acted on: nothing again, nothing audited again
        if not case.drains:
            why = f"the verdict is {case.action}: an application's fault, the node stays in service"
            self._refuse(case, rc.REFUSED_APPLICATION, why)
            return
        halt = store.current_halt(self._db)
        if halt is not None:
            self._refuse(case, rc.REFUSED_HALTED, f"remediation is halted: {halt.reason}")
            return
        if node.name in self._config.exclude_nodes or node.features & set(self._config.exclude_features):
            self._refuse(case, rc.REFUSED_OPTED_OUT, "the node is opted out (exclude_nodes or exclude_features)")
            return
        now = self._clock()
        held = store.node_hold(self._db, node.name)
        if held is not None and held.held and (node.ours or held.dry_run):
            store.add_cause(self._db, node.name, case.case_id, self.name, now, case.culprit)
            self._record(case, rc.JOINED, f"already drained by gpulens ({held.reason}); one more cause holds it")
            return
        if held is not None and held.held:
            store.release(self._db, node.name)  # resumed or taken over by someone else since: no longer ours
        if node.down or (node.drained and not node.ours):
            state = "down" if node.down else f"drained by someone else ({node.reason or 'no reason'})"
            self._record(case, rc.LEFT_ALONE, f"left alone: {state}")
            return
        if held is not None and now - held.drained_at < self._config.cooldown_s:
            ago = f"node drained {now - held.drained_at:.0f} s ago (cooldown {self._config.cooldown_s:g} s)"
            self._refuse(case, rc.REFUSED_COOLDOWN, ago)
            return
        if self._brake(case, nodes, now):
            return
        dry = {name for name, h in store.held_nodes(self._db).items() if h.dry_run}
        ours = {n.name for n in nodes.values() if n.ours} | dry
        limit = max(1, math.floor(self._config.max_drained_fraction * len(nodes)))
        if len(ours - {node.name}) >= limit:
            why = (
                f"{len(ours)} of {len(nodes)} nodes already drained by gpulens (max_drained_fraction "
                f"{self._config.max_drained_fraction:g} allows {limit})"
            )
            self._refuse(case, rc.REFUSED_FRACTION, why)
            return
        self._drain(case, node, now)
        if not self._config.dry_run:  # as sinfo would list it now, for the next case of this call
            nodes[node.name] = SlurmNode(node.name, "drained", node.features, f"{OURS} {case.case_id}")

    def _brake(self, case: RemediationCase, nodes: dict[str, SlurmNode], now: float) -> bool:
        """Halt when this node would make more than ``breaker_nodes`` of the nodes wanted drained in the window."""
        since = now - self._config.breaker_window_s
        wanted = store.nodes_wanted_since(self._db, since, _WANTED) | {case.node}
        limit = max(1, math.floor(self._config.breaker_nodes * len(nodes)))
        if len(wanted) <= limit:
            return False
        reason = (
            f"{len(wanted)} of {len(nodes)} nodes wanted drained within {self._config.breaker_window_s:g} s "
            f"(breaker_nodes {self._config.breaker_nodes:g} allows {limit}): a systemic fault?"
        )
        store.halt(self._db, now, reason)
        logger.critical("remediation halted (%s): %s; lift it with gpulens remediation resume", self.name, reason)
        self._refuse(case, rc.REFUSED_HALTED, f"the brake halted remediation: {reason}")
        return True

    def _drain(self, case: RemediationCase, node: SlurmNode, now: float) -> None:
        reason = f"{OURS} {case.case_id} {case.culprit}".strip()
        if not self._config.dry_run:
            self._run(drain_argv(self._config.scontrol, node.name, reason), self._config.timeout_s)
        hold = store.NodeHold(node.name, self.name, reason, now, True, self._config.dry_run)
        store.hold(self._db, hold, case.case_id, case.culprit)
        self._record(case, rc.DRY_RUN if self._config.dry_run else rc.DRAINED, reason)
        logger.warning("slurm-drain %s%s: drained %s: %s", self.name, self._dry, node.name, reason)
        if self._config.requeue:
            self._requeue(case)

    def _requeue(self, case: RemediationCase) -> None:
        for job in case.jobs:
            if not SLURM_JOB_ID.fullmatch(job):
                self._refuse(case, rc.REFUSED_NODE_NAME, f"job id {job[:32]!r} is not one Slurm job", rc.REQUEUE)
                continue
            if not self._config.dry_run:
                try:
                    self._run(requeue_argv(self._config.scontrol, job), self._config.timeout_s)
                except OSError as exc:  # the node is drained already: a job that cannot requeue stays as it is
                    self._record(case, rc.FAILED, f"requeue {job}: {exc}", rc.REQUEUE)
                    continue
            self._record(case, rc.DRY_RUN if self._config.dry_run else rc.REQUEUED, f"job {job}", rc.REQUEUE)

    # --- a resolved case: resume when it was the last -----------------------------------------------------------

    def _close(self, case: RemediationCase, nodes: dict[str, SlurmNode]) -> None:
        rest = store.drop_cause(self._db, case.node, case.case_id) if not refuse_name(case.node, None) else None
        if rest is None:
            return  # not a cause of any drain (never drained, or a retry)
        held = store.node_hold(self._db, case.node)
        if rest:
            self._record(case, rc.KEPT, f"{len(rest)} other cause(s) still hold the node: {' '.join(rest)}", rc.RESUME)
            return
        if held is None or not held.held:
            return
        if held.dry_run:  # nothing was drained: the node is forgotten, so that a dry run's cap does not fill up
            store.release(self._db, case.node)
            would = "would resume" if self._config.resume_on_resolve else "would stay drained (resume_on_resolve off)"
            self._record(case, rc.DRY_RUN, f"every cause resolved: {would}", rc.RESUME)
            return
        if not self._config.resume_on_resolve:
            self._record(case, rc.KEPT, "every cause resolved; resume_on_resolve is off", rc.RESUME)
            return
        node = nodes.get(case.node)
        if node is None or not node.drained:
            store.release(self._db, case.node)
            self._record(case, rc.LEFT_ALONE, "left alone: no longer drained (resumed by someone else)", rc.RESUME)
            return
        if not node.ours or node.down:
            store.release(self._db, case.node)
            why = "down" if node.down else f"drained by someone else ({node.reason})"
            self._record(case, rc.LEFT_ALONE, f"left alone: {why}", rc.RESUME)
            return
        self._run(resume_argv(self._config.scontrol, node.name), self._config.timeout_s)
        nodes[node.name] = SlurmNode(node.name, "idle", node.features, "")
        store.release(self._db, case.node)
        self._record(case, rc.RESUMED, "every cause resolved", rc.RESUME)
        logger.warning("slurm-drain %s: resumed %s: every cause resolved", self.name, node.name)

    # --- the audit ---------------------------------------------------------------------------------------------------

    @property
    def _dry(self) -> str:
        return " (dry run)" if self._config.dry_run else ""

    def _refuse(self, case: RemediationCase, outcome: str, reason: str, step: str = rc.DRAIN) -> None:
        self.refusals.count(outcome, "slurm-drain %s refused %s: %s", self.name, case.node[:64], reason)
        self._record(case, outcome, reason, step)

    def _record(self, case: RemediationCase, outcome: str, reason: str, step: str = rc.DRAIN) -> None:
        record = DrainRecord(
            time=self._clock(),
            action=self.name,
            node=case.node[:255],
            gpu=case.gpu,
            rule=case.rule,
            outcome=outcome,
            reason=reason,
            step=step,
            causes=case.case_id,
        )
        self.records = [*self.records[-999:], record]
        try:
            record_drain_action(self._db, record)
        except Exception as exc:  # noqa: BLE001 -- the audit store down must not stop the action; it is logged
            logger.warning("slurm-drain %s: cannot store its audit record: %s", self.name, exc)


def remediation_line(decisions: Sequence[Mapping[str, object]]) -> str:
    """One line of what the actions did about an alert (its decisions, newest first): the newest per action and
    step, e.g. "slurm-drain drained node-07; ticket ran"; "" when none."""
    seen: set[tuple[object, object]] = set()
    parts: list[str] = []
    for d in decisions:
        key = (d["action"], d["step"])
        if key in seen:
            continue
        seen.add(key)
        parts.append(
            f"{d['action']} {d['outcome']} {d['node']}" + ("" if d["outcome"] in _PLAIN else f": {d['reason']}")
        )
    return "; ".join(parts)
