"""The ``slurm-drain`` action: take a node with a failing GPU out of Slurm's service, carefully.

It is a notifier (``[[alerts.actions]]`` with ``kind = "slurm-drain"``), so it runs on the notification worker, off the
collector's path, and a failing ``scontrol`` is retried by the delivery stage with its backoff, counted and logged
once. It acts only on the rules listed (``Rule`` or ``Rule:xid``), and is safe by default:

- ``dry_run`` (true by default) decides and records, but runs nothing;
- at most ``max_drained_fraction`` of the cluster's nodes are drained (at least one node), counted with ``sinfo``;
- a node is drained at most once per ``cooldown``;
- a node is resumed only with ``resume_on_resolve``, when the alert that drained it resolves.

Every decision, taken or refused, is handed to ``audit`` (the ``drain_actions`` table and the alerts page).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpulens.alerts.notify import DeliveryError
from gpulens.alerts.state import FIRING, RESOLVED, AlertState

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
DRAINED: Final = "drained"
DRY_RUN: Final = "dry-run"
RESUMED: Final = "resumed"
REFUSED_COOLDOWN: Final = "refused-cooldown"
REFUSED_FRACTION: Final = "refused-max-fraction"
REFUSED_NO_NODE: Final = "refused-no-node"
FAILED: Final = "failed"

Runner = Callable[[Sequence[str], float], str]


@dataclass(frozen=True)
class DrainConfig:
    name: str = DRAIN_KIND
    rules: tuple[str, ...] = DEFAULT_RULES
    dry_run: bool = True
    max_drained_fraction: float = 0.05
    cooldown_s: float = 3600.0
    resume_on_resolve: bool = False
    scontrol: str = "scontrol"
    sinfo: str = "sinfo"
    timeout_s: float = 10.0


@dataclass(frozen=True)
class DrainRecord:
    """One decision of the action: what it did (or would do, or refused) to which node, and why."""

    time: float
    action: str  # the [[alerts.actions]] entry's name
    node: str
    gpu: str
    rule: str
    outcome: str  # DRAINED, DRY_RUN, RESUMED, REFUSED_*, FAILED
    reason: str  # the drain reason given to Slurm, or why it was refused or failed


def run_command(argv: Sequence[str], timeout_s: float) -> str:
    """Run ``argv``; its standard output. Raises ``OSError`` naming the failure (never a traceback to the user)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise OSError(f"{argv[0]} did not answer within {timeout_s:g} s") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        raise OSError(f"{argv[0]} exited {done.returncode}: {lines[-1] if lines else 'no output'}")
    return done.stdout


class SlurmDrainer:
    """The ``slurm-drain`` notifier. ``run`` runs a command (raising ``OSError``); ``clock`` is wall-clock seconds."""

    def __init__(
        self,
        config: DrainConfig,
        *,
        audit: Callable[[DrainRecord], None] | None = None,
        run: Runner = run_command,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = config.name
        self._config = config
        self._audit = audit
        self._run = run
        self._clock = clock
        self._drained_at: dict[str, float] = {}
        self._lock = threading.Lock()
        self.records: list[DrainRecord] = []  # this process's decisions, newest last (bounded)

    def send(
        self,
        alerts: Sequence[AlertState],
        *,
        group_labels: Mapping[str, str],
        status: str,
        group_key: str = "",
    ) -> None:
        """Act on each listed alert. Raises a retryable ``DeliveryError`` when ``scontrol`` or ``sinfo`` failed."""
        failures: list[str] = []
        with self._lock:
            for alert in alerts:
                if not self._selected(alert):
                    continue
                try:
                    if alert.state == FIRING:
                        self._drain(alert)
                    elif alert.state == RESOLVED and self._config.resume_on_resolve:
                        self._resume(alert)
                except OSError as exc:
                    self._record(alert, FAILED, str(exc))
                    failures.append(str(exc))
        if failures:
            raise DeliveryError(f"slurm-drain {self.name}: {failures[0]}", retryable=True)

    def _selected(self, alert: AlertState) -> bool:
        xid = alert.labels.get("xid")
        return alert.rule in self._config.rules or (xid is not None and f"{alert.rule}:{xid}" in self._config.rules)

    def _drain(self, alert: AlertState) -> None:
        node = alert.labels.get("node", "")
        now = self._clock()
        if not node:
            self._record(alert, REFUSED_NO_NODE, "the alert names no node")
            return
        last = self._drained_at.get(node)
        if last is not None and now - last < self._config.cooldown_s:
            ago = f"node drained {now - last:.0f} s ago (cooldown {self._config.cooldown_s:g} s)"
            self._record(alert, REFUSED_COOLDOWN, ago)
            return
        total, drained = self._node_counts(node)
        limit = max(1, math.floor(self._config.max_drained_fraction * total))
        if drained >= limit:
            self._record(
                alert,
                REFUSED_FRACTION,
                f"{drained} of {total} nodes already drained (max_drained_fraction "
                f"{self._config.max_drained_fraction:g} allows {limit})",
            )
            return
        reason = self._reason(alert, now)
        if self._config.dry_run:
            self._drained_at[node] = now
            self._record(alert, DRY_RUN, reason)
            logger.warning("slurm-drain %s (dry run): would drain %s: %s", self.name, node, reason)
            return
        self._run(
            [self._config.scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"],
            self._config.timeout_s,
        )
        self._drained_at[node] = now
        self._record(alert, DRAINED, reason)
        logger.warning("slurm-drain %s: drained %s: %s", self.name, node, reason)

    def _resume(self, alert: AlertState) -> None:
        node = alert.labels.get("node", "")
        if not node or node not in self._drained_at:
            return  # only a node this action drained is resumed
        if not self._config.dry_run:
            self._run([self._config.scontrol, "update", f"NodeName={node}", "State=RESUME"], self._config.timeout_s)
        del self._drained_at[node]
        self._record(alert, DRY_RUN if self._config.dry_run else RESUMED, f"{alert.rule} resolved")

    def _node_counts(self, node: str) -> tuple[int, int]:
        """(nodes in the cluster, nodes drained or draining), the node itself counted as one of them."""
        out = self._run([self._config.sinfo, "-h", "-N", "-o", "%N %T"], self._config.timeout_s)
        states: dict[str, str] = {}
        for line in out.splitlines():
            fields = line.split()
            if len(fields) == 2:
                states[fields[0]] = fields[1].lower()
        drained = sum(1 for name, state in states.items() if "drain" in state and name != node)
        return max(len(states), 1), drained

    def _reason(self, alert: AlertState, now: float) -> str:
        gpu = alert.labels.get("uuid") or alert.labels.get("gpu", "?")
        what = alert.rule + (f" {alert.labels['xid']}" if "xid" in alert.labels else "")
        stamp = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"gpulens {what} on GPU {alert.labels.get('gpu', '?')} ({gpu}) at {stamp}"

    def _record(self, alert: AlertState, outcome: str, reason: str) -> None:
        record = DrainRecord(
            time=self._clock(),
            action=self.name,
            node=alert.labels.get("node", ""),
            gpu=alert.labels.get("gpu", ""),
            rule=alert.rule + (f":{alert.labels['xid']}" if "xid" in alert.labels else ""),
            outcome=outcome,
            reason=reason,
        )
        self.records = [*self.records[-999:], record]
        if self._audit is not None:
            try:
                self._audit(record)
            except Exception as exc:  # noqa: BLE001 -- the audit store down must not stop the action; it is logged
                logger.warning("slurm-drain %s: cannot store its audit record: %s", self.name, exc)
