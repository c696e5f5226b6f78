"""Where the dashboard reads alerts from: anything with these methods, returning the alert engine's records.

Storage keeps the engine's alert states, their history and the silences in SQL; its reader is passed to
``create_app(db, alerts=...)``. Without one the pages say that no alert store is connected instead of showing
nothing and implying that nothing fires.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpulens.alerts.incidents import Incident
from gpulens.alerts.state import AlertState, Silence


class AlertReader(Protocol):
    def active(self) -> Sequence[AlertState]:
        """The alerts pending or firing now."""
        ...

    def history(self, start: float, end: float) -> Sequence[AlertState]:
        """Every alert episode that was pending or firing at some time in [start, end], resolved or not."""
        ...

    def silences(self, now: float) -> Sequence[Silence]:
        """The silences active at ``now`` or scheduled after it."""
        ...

    def open_incidents(self) -> Sequence[Incident]:
        """The incidents open now, the most severe first, then the oldest (``alerts.incidents``); a store that keeps
        none raises ``NotAvailableOnBackend``."""
        ...

    def incidents(self, since: float) -> Sequence[Incident]:
        """The incidents open now and those resolved since ``since``, newest first; a store that keeps none raises
        ``NotAvailableOnBackend``."""
        ...


def counts_as_firing(alert: AlertState) -> bool:
    """Firing, and not a heartbeat: the Watchdog (severity ``none``) fires in every round to prove the engine runs,
    so the pages list it but never count it among the alerts firing."""
    return alert.state == "firing" and alert.labels.get("severity") != "none"
