"""gpulens alerts: builtin and user rules over recent scrape rounds, a pure state machine, grouping and notifiers.

The pieces, in the order a scrape round flows through them:

- ``history.History``: the rolling window of recent rounds the rules look at (``fabrichistory``: its RDMA ports,
  hosts and jobs' host shares);
- ``rules.evaluate``: every rule's conditions that hold now (``Candidate``): ``checks`` (GPUs and nodes), ``detect``
  (hung and straggling jobs), ``fabricchecks`` (InfiniBand/RoCE ports), ``hostchecks`` (jobs starved by their host,
  a hung driver);
- ``state.step``: pending -> firing -> resolved, ``for``, ``keep_firing_for``, inhibition and silences;
- ``grouping.Grouper``: routes and Alertmanager-like grouping into ``Notification``s;
- ``notify.delivery.Delivery``: the outbox and the one retry stage, through ``notify.slack`` and ``notify.webhook``.

``engine.AlertEngine`` drives them together; ``replay`` runs a simulated cluster through it. See docs/alerts.md.
"""

from gpulens.extras import require_server

require_server("gpulens.alerts", "sqlalchemy")

from gpulens.alerts.base import AlertRule, Candidate  # noqa: E402
from gpulens.alerts.catalogue import BUILTIN_NAMES  # noqa: E402
from gpulens.alerts.engine import AlertEngine, EngineRound  # noqa: E402
from gpulens.alerts.grouping import Grouper, GroupState, Notification, Route  # noqa: E402
from gpulens.alerts.history import History  # noqa: E402
from gpulens.alerts.rules import builtin_rules, evaluate  # noqa: E402
from gpulens.alerts.state import AlertState, Silence, StepResult, fingerprint, step  # noqa: E402

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
