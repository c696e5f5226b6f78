"""``deploy/make-secrets.sh --web``: the three steps docs/security.md gives for TLS and basic auth work as written.

The script writes a key, a self-signed certificate, a password and web.yml; an exporter started with that web.yml
answers ``/metrics`` over HTTPS to the collector's password only, verified against the certificate written.
"""

from __future__ import annotations

import base64
import os
import ssl
import subprocess
import sys
import threading
from pathlib import Path

from gpulens.exporter.agent import PLAIN_HTTP_HINT, ExporterOptions, run_exporter
from tests.conftest import http_get
from tests.slurm.conftest import wait_for

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "make-secrets.sh"


def test_make_secrets_web_turns_on_tls_and_basic_auth_for_the_exporter(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    made = subprocess.run(["bash", str(SCRIPT), "--web", str(tmp_path)], env=env, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    web = tmp_path / "web"
    assert sorted(p.name for p in web.iterdir()) == ["collector-password", "tls.crt", "tls.key", "web.yml"]
    again = subprocess.run(["bash", str(SCRIPT), "--web", str(tmp_path)], env=env, capture_output=True, text=True)
    assert again.returncode == 0
    assert "keeping it" in again.stderr
    password = (web / "collector-password").read_text().strip()
    assert password not in (web / "web.yml").read_text()  # only its hash

    options = ExporterOptions(
        source="sim",
        scenario=str(REPO / "examples" / "scenarios" / "healthy.toml"),
        listen="127.0.0.1:0",
        interval_s=0.5,
        fabric=False,
        web_config=str(web / "web.yml"),
    )
    announced: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(target=run_exporter, args=(options, announced.append, stop), daemon=True)
    thread.start()
    try:
        wait_for(lambda: announced, "the exporter to announce itself")
        url = announced[0].rsplit(" ", 1)[1]
        assert url.startswith("https://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(web / "tls.crt"))
        token = base64.b64encode(f"collector:{password}".encode()).decode()
        status, _, body = http_get(url, headers={"Authorization": f"Basic {token}"}, context=context)
        assert status == 200
        assert b"gpulens_exporter_build_info" in body
        assert http_get(url, context=context)[0] == 401
        assert len(announced) == 1  # no hint: TLS and auth are on
    finally:
        stop.set()
        thread.join(timeout=10)


def test_an_exporter_open_to_the_network_without_them_says_how_to_turn_them_on() -> None:
    options = ExporterOptions(
        source="sim",
        scenario=str(REPO / "examples" / "scenarios" / "healthy.toml"),
        listen="0.0.0.0:0",
        interval_s=0.5,
        fabric=False,
    )
    announced: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(target=run_exporter, args=(options, announced.append, stop), daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(announced) == 2, "the exporter's two first lines")
        assert announced[1] == PLAIN_HTTP_HINT
        assert "deploy/make-secrets.sh --web" in PLAIN_HTTP_HINT
    finally:
        stop.set()
        thread.join(timeout=10)
