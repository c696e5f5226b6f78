"""Slack's limits against a stand-in on 127.0.0.1 that enforces them as Slack documents them (HTTP 400 over 3,000
characters per section text, 2,000 per field, 10 fields, 150 per header, 50 blocks), and what the on-call engineer
reads: description, cause, stuck ranks, fabric evidence and the rule's advice, in Slack and in the webhook."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpulens.alerts.notify import DeliveryError
from gpulens.alerts.notify.slack import SlackNotifier, fit
from gpulens.alerts.notify.webhook import WebhookNotifier
from gpulens.alerts.state import FIRING, AlertState, fingerprint

_ENTITY_SAFE = re.compile(r"&(?!amp;|lt;|gt;)")


def slack_refusal(message: Any, max_body: int | None) -> str | None:
    """What Slack would answer with 400, or None to accept (its documented Block Kit limits)."""
    if max_body is not None and len(json.dumps(message)) > max_body:
        return "msg_too_long"
    for attachment in message.get("attachments", []):
        blocks = attachment.get("blocks", [])
        if len(blocks) > 50:
            return "invalid_blocks"
        for block in blocks:
            text = block.get("text") or {}
            if block["type"] == "header" and len(text.get("text", "")) > 150:
                return "invalid_blocks"
            if block["type"] == "section":
                if len(text.get("text", "")) > 3000 or len(block.get("fields", [])) > 10:
                    return "invalid_blocks"
                if any(len(f["text"]) > 2000 for f in block.get("fields", [])):
                    return "invalid_blocks"
    return None


@dataclass
class StandIn:
    max_body: int | None = None
    accepted: list[Any] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    server: Any

    def do_POST(self) -> None:
        state: StandIn = self.server.state
        message = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        refusal = slack_refusal(message, state.max_body)
        if refusal is None:
            state.accepted.append(message)
        else:
            state.refused.append(refusal)
        answer = (refusal or "ok").encode()
        self.send_response(400 if refusal else 200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def slack() -> Iterator[tuple[str, StandIn]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.state = StandIn()  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/services/T/B/x", httpd.state  # type: ignore[attr-defined]
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def stall(job: str, annotations: dict[str, str] | None = None, **labels: str) -> AlertState:
    full = {"alertname": "CommunicationStall", "severity": "critical", "job_id": job, **labels}
    return AlertState(
        fingerprint=fingerprint(full),
        rule=full["alertname"],
        labels=full,
        annotations={"summary": f"job {job}: 16 GPUs at 100% with no NVLink traffic", **(annotations or {})},
        state=FIRING,
        active_since=1_767_225_600.0,
        fired_at=1_767_225_660.0,
        value=0.01,
    )


def texts(message: Any) -> list[str]:
    out = [message["text"]]
    for block in message["attachments"][0]["blocks"]:
        out += [t["text"] for t in [block.get("text") or {}, *block.get("fields", []), *block.get("elements", [])] if t]
    return out


def mrkdwn_objects(message: Any) -> list[dict[str, Any]]:
    out = []
    for block in message["attachments"][0]["blocks"]:
        for t in [block.get("text") or {}, *block.get("fields", []), *block.get("elements", [])]:
            if t.get("type") == "mrkdwn":
                out.append(t)
    return out


def test_a_job_name_of_500_ampersands_and_a_gpu_shared_by_60_pods_reach_slack(slack: tuple[str, StandIn]) -> None:
    url, state = slack
    pods = ",".join(f"team-a/pod-{i:03d}-{'x' * 40}" for i in range(60))  # one GPU time-sliced by 60 pods
    alerts = [
        stall("&" * 500, {"description": "&" * 500}, user="<!here>"),
        stall(pods, {"description": f"Held by {pods}."}, user=pods, node="node-01", gpu="0"),
    ]
    SlackNotifier(url, name="ops").send(alerts, group_labels={}, status=FIRING)
    assert state.refused == []
    [message] = state.accepted
    shown = texts(message)
    assert all(not _ENTITY_SAFE.search(t) for t in shown)  # every & begins a whole entity: none was cut
    assert any(t.endswith("more") and "&amp;" in t for t in shown)  # the 500 & were cut, and say so
    assert any(re.search(r"… and \d+ more$", t) and "pod-" in t for t in shown)  # the pod list: "and N more"
    assert "<!here>" not in json.dumps(message)  # escaped, never a mention
    assert all(obj["verbatim"] is True for obj in mrkdwn_objects(message))


def test_many_alerts_stay_within_50_blocks(slack: tuple[str, StandIn]) -> None:
    url, state = slack
    alerts = [stall(f"job-{i}", {"description": "d", "runbook": "r"}, node="n", gpu="0") for i in range(40)]
    SlackNotifier(url, name="ops", max_alerts=40).send(alerts, group_labels={}, status=FIRING)
    [message] = state.accepted
    blocks = message["attachments"][0]["blocks"]
    assert len(blocks) <= 50
    assert blocks[-1]["elements"][0]["text"].startswith("and ")


@pytest.mark.parametrize(("text", "limit"), [("&" * 50, 23), ("a, b, c, d, e, f, g, h", 20), ("x<y " * 20, 31)])
def test_fit_never_cuts_an_entity_and_says_how_much_is_left(text: str, limit: int) -> None:
    out = fit(text, limit)
    assert len(out) <= limit
    assert not _ENTITY_SAFE.search(out)
    assert not re.search(r"&(amp|lt|gt)?$", out.split(" … ")[0])
    assert re.search(r" … and \d+ more$", out)


def test_a_400_for_size_is_logged_once_and_a_shorter_message_is_sent(
    slack: tuple[str, StandIn], caplog: pytest.LogCaptureFixture
) -> None:
    """A Slack workspace that refuses long messages (a body limit below what the full message needs)."""
    url, state = slack
    state.max_body = 1500
    caplog.set_level(logging.WARNING, logger="gpulens")
    notifier = SlackNotifier(url, name="ops")
    long = {"description": "x " * 600, "runbook": "Restart from the last checkpoint."}
    for i in range(2):
        notifier.send([stall(f"job-{i}", long, node="node-01")], group_labels={}, status=FIRING)
    assert state.refused == ["msg_too_long", "msg_too_long"]
    assert len(state.accepted) == 2  # never a silent drop: the shorter message went
    assert all("job-" in json.dumps(m) and "x x x" not in json.dumps(m) for m in state.accepted)
    lines = [r for r in caplog.records if "shorter one" in r.getMessage()]
    assert len(lines) == 1
    assert "HTTP 400" in lines[0].getMessage()
    state.max_body = 10  # even the short one is refused: a typed error, not retried
    with pytest.raises(DeliveryError, match="also for the shortened message") as err:
        notifier.send([stall("job-9", long)], group_labels={}, status=FIRING)
    assert not err.value.retryable


EVIDENCE = {
    "description": "Every GPU of the job shows 100% utilization, but traffic per GPU fell to 0 B/s.",
    "cause": "IbLinkDown node-03 mlx5_2",
    "stuck_ranks": "rank 5 (node-02 GPU 1, pid 4242) at AllReduce #1180 of 1181",
    "fabric": "Port node-03 mlx5_2 is down.",
    "runbook": "Look at the job's logs for the rank that died or hangs.",
}


def test_slack_shows_the_cause_the_stuck_ranks_the_fabric_and_the_advice(slack: tuple[str, StandIn]) -> None:
    url, state = slack
    SlackNotifier(url).send([stall("llm", EVIDENCE, nodes="node-02,node-03")], group_labels={}, status=FIRING)
    [message] = state.accepted
    details = message["attachments"][0]["blocks"][2]["text"]["text"].split("\n")
    assert details == [
        EVIDENCE["description"],
        f"*Cause:* {EVIDENCE['cause']}",
        f"*Stuck ranks:* {EVIDENCE['stuck_ranks']}",
        f"*Fabric:* {EVIDENCE['fabric']}",
        f"*Do:* {EVIDENCE['runbook']}",
    ]
    fields = [f["text"] for f in message["attachments"][0]["blocks"][3]["fields"]]
    assert "*Nodes*\nnode-02,node-03" in fields


def test_the_webhook_carries_the_same_evidence() -> None:
    hook = WebhookNotifier("http://unused.invalid/", name="am")
    payload = hook.render([stall("llm", EVIDENCE, nodes="node-02,node-03")], group_labels={}, status=FIRING)
    [sent] = payload["alerts"]
    assert {k: sent["annotations"][k] for k in EVIDENCE} == EVIDENCE
    assert sent["labels"]["nodes"] == "node-02,node-03"
