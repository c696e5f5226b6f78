"""A receiver that appends each notification to a local file as one JSON line: for demos, air-gapped clusters and
for tailing with ``jq``. The payload is Alertmanager's version-4 shape, like a webhook's."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpulens.alerts.notify import DeliveryError
from gpulens.alerts.notify.webhook import alertmanager_payload
from gpulens.alerts.state import AlertState


class LogNotifier:
    def __init__(self, path: str | Path, *, name: str, external_url: str = "") -> None:
        self.name = name
        self._path = Path(path)
        self._external_url = external_url
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
        payload = alertmanager_payload(
            alerts,
            receiver=self.name,
            group_labels=group_labels,
            status=status,
            group_key=group_key,
            external_url=self._external_url,
            incidents=incidents,
        )
        line = json.dumps(payload, separators=(",", ":")) + "\n"
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            with self._lock, self._path.open("a", encoding="utf-8") as f:
                f.write(line)
        except OSError as exc:
            raise DeliveryError(
                f"receiver {self.name}: cannot append to {self._path}: {exc.strerror}", retryable=True
            ) from None
