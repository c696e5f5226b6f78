"""A real Alertmanager (Debian's ``prometheus-alertmanager``) for tests: start, stop and start again on its port, and
ask its API v2."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import free_port, http_get

# Every alert goes to a receiver that sends nothing; a critical alert inhibits the warnings of its node.
CONFIG: dict[str, Any] = {
    "route": {"receiver": "null", "group_wait": "1h"},
    "receivers": [{"name": "null"}],
    "inhibit_rules": [
        {"source_matchers": ['severity="critical"'], "target_matchers": ['severity="warning"'], "equal": ["node"]}
    ],
}


class Alertmanager:
    """One Alertmanager on 127.0.0.1 with no cluster gossip; ``stop`` and ``start`` keep its port."""

    def __init__(self, binary: str, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "alertmanager.yml").write_text(yaml.safe_dump(CONFIG))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Alertmanager:
        with (self.workdir / "alertmanager.log").open("ab") as log:
            self._proc = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.workdir / 'alertmanager.yml'}",
                    f"--storage.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                if http_get(f"{self.url}/-/ready", timeout=2)[0] == 200:
                    return self
            except OSError:
                pass
            if self._proc.poll() is not None or time.monotonic() > deadline:
                log_text = (self.workdir / "alertmanager.log").read_text()[-2000:]
                raise RuntimeError(f"Alertmanager did not start:\n{log_text}")
            time.sleep(0.1)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def alerts(self) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts``: the active alerts, silenced and inhibited ones included (resolved ones are not)."""
        status, _, body = http_get(f"{self.url}/api/v2/alerts")
        assert status == 200, body
        found: list[dict[str, Any]] = json.loads(body)
        return found

    def alert(self, **labels: str) -> dict[str, Any] | None:
        """The one alert whose labels include ``labels``, if any."""
        matching = [a for a in self.alerts() if all(a["labels"].get(k) == v for k, v in labels.items())]
        assert len(matching) <= 1, matching
        return matching[0] if matching else None

    def silence(self, matchers: dict[str, str], *, hours: float = 1.0) -> str:
        """``POST /api/v2/silences``: silence the alerts matching ``matchers`` from now; returns its id."""
        now = time.time()
        doc = {
            "matchers": [{"name": k, "value": v, "isRegex": False, "isEqual": True} for k, v in matchers.items()],
            "startsAt": _rfc3339(now - 1),
            "endsAt": _rfc3339(now + hours * 3600),
            "createdBy": "gpulens tests",
            "comment": "test silence",
        }
        request = urllib.request.Request(
            f"{self.url}/api/v2/silences",
            data=json.dumps(doc).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            silence_id: str = json.loads(response.read())["silenceID"]
        return silence_id


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
