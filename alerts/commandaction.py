"""The ``command`` action: run a site's own program with the verdict as arguments (to open a ticket, reset a GPU its
own way). ``[[alerts.actions]]`` with ``kind = "command"`` and ``argv = ["/usr/local/sbin/gpu-ticket", "--queue",
"hw"]``; each case of a listed rule runs ``argv`` followed by::

    --case ID --state firing|resolved --culprit-kind gpu --culprit TEXT --node NODE --gpu N --action VERDICT
    --jobs 12,13 --alerts XidError:79

An argv list, never a shell: no argument is ever parsed by one. ``dry_run`` (true by default) only records. The
node's name must be one node name (``alerts.slurmnodes.NODE_NAME``); while the brake halts remediation, nothing
runs. Each run is audited (``drain_action``, step ``command``); a failed run is retried by the delivery stage.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gpulens.alerts import remediationcase as rc
from gpulens.alerts.notify import DeliveryError
from gpulens.alerts.remediationcase import DrainRecord, RemediationCase
from gpulens.alerts.slurmnodes import Runner, refuse_name, run_command
from gpulens.alerts.state import FIRING, RESOLVED, AlertState
from gpulens.storage import remediationstore as store
from gpulens.storage.db import Database
from gpulens.storage.slurmtables import record_drain_action

logger = logging.getLogger(__name__)

COMMAND_KIND: Final = "command"


@dataclass(frozen=True)
class CommandConfig:
    name: str
    argv: tuple[str, ...]
    rules: tuple[str, ...]
    dry_run: bool = True
    timeout_s: float = 60.0


def verdict_argv(argv: Sequence[str], case: RemediationCase) -> list[str]:
    """``argv`` followed by the case as ``--name value`` pairs (the values as they are: no shell reads them)."""
    return [
        *argv,
        "--case",
        case.case_id,
        "--state",
        FIRING if case.firing else RESOLVED,
        "--culprit-kind",
        case.culprit_kind,
        "--culprit",
        case.culprit,
        "--node",
        case.node,
        "--gpu",
        case.gpu,
        "--action",
        case.action,
        "--jobs",
        ",".join(case.jobs),
        "--alerts",
        ",".join(case.alerts),
    ]


class CommandAction:
    """The ``command`` notifier over ``db`` (its audit and the brake's halt)."""

    def __init__(
        self,
        config: CommandConfig,
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

    def send(
        self,
        alerts: Sequence[AlertState],
        *,
        group_labels: Mapping[str, str],
        status: str,
        group_key: str = "",
        incidents: Sequence[Mapping[str, str]] = (),
    ) -> None:
        cases = rc.cases_from_notification(alerts, group_labels, status, group_key, self._config.rules)
        self.act(cases)

    def act(self, cases: Sequence[RemediationCase]) -> None:
        """Run the program once per case. Raises a retryable ``DeliveryError`` when a run failed."""
        failures: list[str] = []
        with self._lock:
            for case in cases:
                refusal = refuse_name(case.node, None)
                if refusal:
                    self._record(case, rc.REFUSED_NODE_NAME, refusal)
                    continue
                halt = store.current_halt(self._db)
                if halt is not None and case.firing:
                    self._record(case, rc.REFUSED_HALTED, f"remediation is halted: {halt.reason}")
                    continue
                argv = verdict_argv(self._config.argv, case)
                if self._config.dry_run:
                    self._record(case, rc.DRY_RUN, " ".join(argv[:1] + argv[len(self._config.argv) :]))
                    continue
                try:
                    self._run(argv, self._config.timeout_s)
                except OSError as exc:
                    self._record(case, rc.FAILED, str(exc))
                    failures.append(str(exc))
                    continue
                self._record(case, rc.RAN, f"{argv[0]} ran for case {case.case_id}")
        if failures:
            raise DeliveryError(f"command {self.name}: {failures[0]}", retryable=True)

    def _record(self, case: RemediationCase, outcome: str, reason: str) -> None:
        record = DrainRecord(
            self._clock(), self.name, case.node[:255], case.gpu, case.rule, outcome, reason, rc.COMMAND, case.case_id
        )
        try:
            record_drain_action(self._db, record)
        except Exception as exc:  # noqa: BLE001 -- the audit store down must not stop the action; it is logged
            logger.warning("command %s: cannot store its audit record: %s", self.name, exc)
