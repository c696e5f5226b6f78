"""gpulens alerts: builtin and user rules over recent scrape rounds, a pure state machine, grouping and notifiers.

The pieces, in the order a scrape round flows through them:

- ``history.History``: the rolling window of recent rounds the rules look at (``fabrichistory``: its RDMA ports,
  hosts and jobs' host shares);
- ``rules.evaluate``: every rule's conditions that hold now (``Candidate``): ``checks`` (GPUs and nodes), ``detect``
  (hung and straggling jobs), ``fabricchecks`` (InfiniBand/RoCE ports), ``hostchecks`` (jobs starved by their host);
- ``state.step``: pending -> firing -> resolved, ``for``, ``keep_firing_for``, inhibition and silences;
- ``grouping.Grouper``: routes and Alertmanager-like grouping into ``Notification``s;
- ``notify.delivery.Delivery``: the outbox and the one retry stage, through ``notify.slack`` and ``notify.webhook``.

``engine.AlertEngine`` drives them together; ``replay`` runs a simulated cluster through it. See docs/alerts.md.
"""

from .base import AlertRule, Candidate
from .catalogue import BUILTIN_NAMES
from .engine import AlertEngine, EngineRound
from .grouping import Grouper, GroupState, Notification, Route
from .history import History
from .rules import builtin_rules, evaluate
from .state import AlertState, Silence, StepResult, fingerprint, step

__all__ = [
    "BUILTIN_NAMES",
    "AlertEngine",
    "AlertRule",
    "AlertState",
    "Candidate",
    "EngineRound",
    "GroupState",
    "Grouper",
    "History",
    "Notification",
    "Route",
    "Silence",
    "StepResult",
    "builtin_rules",
    "evaluate",
    "fingerprint",
    "step",
]
