"""``gpulens node-health``: this node's health from its exporter, as a Slurm ``HealthCheckProgram`` can use it."""

from __future__ import annotations

import argparse
import base64
import json
import ssl
import sys
from pathlib import Path
from typing import Any

from gpulens.cli.base import Formatter, add_log_level
from gpulens.cli.envtwins import apply_env_twins

EXAMPLES = """\
examples:
  gpulens node-health                                   # the local exporter's verdict; exit 0, 1 or 2
  gpulens node-health --json
  gpulens node-health --url https://127.0.0.1:9410/api/v1/snapshot --ca-file /etc/gpulens/ca.pem \\
      --user gpulens --password-file /etc/gpulens/exporter-password
  # Slurm (slurm.conf): HealthCheckProgram=/usr/local/sbin/gpulens-health-check; see docs/operations.md
"""

DEFAULT_URL = "http://127.0.0.1:9410/api/v1/snapshot"
MAX_BYTES = 64 << 20


def register(sub: Any) -> None:
    p = sub.add_parser(
        "node-health",
        help="this node's health (Healthy, Degraded, Unhealthy), its reasons and the action that fixes it",
        description="Asks the node's exporter for its snapshot and prints the node's health: Healthy, Degraded or "
        "Unhealthy, each finding (a lost GPU, a failed row remapping, a narrow PCIe link, a port down, ...) and one "
        "suggested action (none, check-application, reset-gpu, reboot, hardware-inspection). Exits 0 when healthy, "
        "1 when degraded, 2 when unhealthy or when the exporter does not answer. It never drains the node: the "
        "health check that calls it decides (docs/operations.md).",
        epilog=EXAMPLES,
        formatter_class=Formatter,
    )
    p.add_argument("--url", default=DEFAULT_URL, help="the exporter's snapshot URL")
    p.add_argument("--user", default=None, help="basic auth user of the exporter")
    p.add_argument("--password-file", default=None, help="a file holding the basic auth password")
    p.add_argument("--ca-file", default=None, help="CA bundle to verify the exporter's TLS certificate")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the exporter")
    p.add_argument("--json", action="store_true", help="print the verdict as one JSON object")
    add_log_level(p)
    apply_env_twins(p, "GPULENS_NODE_HEALTH_")
    p.set_defaults(func=_run)


class _UnusableError(Exception):
    """The command cannot ask the exporter as told (exit 2, like an unhealthy node: it vouches for nothing)."""


def _headers(args: argparse.Namespace) -> dict[str, str]:
    if args.user is None:
        return {}
    if args.password_file is None:
        raise _UnusableError("--user needs --password-file (a password is never given on the command line)")
    try:
        password = Path(args.password_file).read_text().strip()
    except OSError as exc:
        raise _UnusableError(f"cannot read --password-file {args.password_file}: {exc.strerror}") from None
    token = base64.b64encode(f"{args.user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _run(args: argparse.Namespace) -> int:
    from gpulens.httpfetch import fetch_url
    from gpulens.model import SnapshotFormatError, SourceError
    from gpulens.nodehealth import UNHEALTHY, NodeHealth, node_health
    from gpulens.snapshotcodec import snapshot_from_bytes

    try:
        headers = _headers(args)
        context = ssl.create_default_context(cafile=args.ca_file) if args.ca_file else None
    except (_UnusableError, OSError) as exc:
        print(f"gpulens node-health: error: {exc}", file=sys.stderr)
        return 2
    try:
        body = fetch_url(
            args.url,
            args.timeout,
            max_bytes=MAX_BYTES,
            what="the exporter",
            accept="application/json",
            headers=headers,
            context=context,
        )
        snapshot = snapshot_from_bytes(body)
        health, node = node_health(snapshot), snapshot.node
    except (SourceError, SnapshotFormatError) as exc:
        health, node = NodeHealth(UNHEALTHY, (), "none"), ""
        reason = f"no verdict: {exc}"
    else:
        reason = ""
    if args.json:
        doc = {"node": node, **health.to_json()}
        if reason:
            doc["error"] = reason
        print(json.dumps(doc))
    else:
        print(f"{health.state}" + (f" ({node})" if node else "") + f": action {health.action}")
        for finding in health.findings:
            print(f"  {finding.state}: {finding.text()}")
        if reason:
            print(f"  {reason}")
    sys.stdout.flush()
    return health.exit_code
