"""The ``gpulens`` command line. The only place that prints errors and chooses exit codes.

Each subcommand's flags have an environment twin, ``GPULENS_<COMMAND>_<FLAG>`` (``--listen`` of ``gpulens exporter``
is ``GPULENS_EXPORTER_LISTEN``); a flag on the command line wins over its twin.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import gpulens
from gpulens.config import ConfigError, format_timestamp, parse_duration
from gpulens.model import SourceError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 1."""


class UsageError(Exception):
    """A bad flag or flag value: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def positive_duration(text: str) -> float:
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return seconds


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def apply_env_twins(parser: argparse.ArgumentParser, prefix: str, environ: Any = None) -> None:
    """Give every flag of ``parser`` an environment twin ``<prefix><FLAG>``: named in --help, used as its default."""
    env = os.environ if environ is None else environ
    for action in parser._actions:  # argparse offers no public iterator over actions
        if not action.option_strings or action.dest in ("help", "version"):
            continue
        name = prefix + action.dest.upper()
        action.help = f"{action.help} [env: {name}]" if action.help else f"[env: {name}]"
        raw = env.get(name)
        if raw is None:
            continue
        flag = action.option_strings[-1]
        if isinstance(action, argparse._StoreTrueAction):
            if raw.strip().lower() not in _TRUE | _FALSE:
                raise UsageError(f"{name}={raw!r}: expected true or false (the twin of {flag})")
            action.default = raw.strip().lower() in _TRUE
        elif isinstance(action, argparse._AppendAction):
            action.default = [item for item in raw.split(",") if item]
        else:
            convert: Callable[[str], Any] = action.type if callable(action.type) else str
            try:
                value = convert(raw)
            except (argparse.ArgumentTypeError, ValueError) as exc:
                raise UsageError(f"{name}={raw!r}: {exc} (the twin of {flag})") from None
            if action.choices is not None and value not in action.choices:
                choices = ", ".join(map(str, action.choices))
                raise UsageError(f"{name}={raw!r}: expected one of {choices} (the twin of {flag})")
            action.default = value


EXPORTER_EXAMPLES = """\
examples:
  # on a GPU node (reads NVML), Prometheus scrapes :9410/metrics
  gpulens exporter
  # map GPU processes to Slurm jobs through prolog files, and add dcgm-exporter-named series for old dashboards
  gpulens exporter --job-map-dir /run/gpustat --dcgm-compat
  # re-export a local dcgm-exporter with gpulens names (and its profiling fields)
  gpulens exporter --source dcgm --dcgm-url http://127.0.0.1:9400/metrics
  # one node of a simulated cluster, 10x faster than real time
  gpulens exporter --source sim --scenario examples/scenarios/stall.toml --node node-01 --speed 10
  # every node of a simulated cluster from one process: /node/<name>/metrics
  gpulens exporter --source sim --scenario examples/scenarios/healthy.toml --all-nodes --listen 127.0.0.1:9410
  # TLS and basic auth (Prometheus exporter-toolkit format)
  gpulens exporter --web-config /etc/gpulens/web.yml
"""


def _add_exporter(sub: Any) -> None:
    p = sub.add_parser(
        "exporter",
        help="run the per-node agent: /metrics, /api/v1/snapshot, /healthz",
        description="The per-node agent. Reads NVML, a dcgm-exporter or a simulated cluster in the background and "
        "serves Prometheus /metrics, a JSON snapshot at /api/v1/snapshot and /healthz.",
        epilog=EXPORTER_EXAMPLES,
        formatter_class=_Formatter,
    )
    p.add_argument("--source", choices=["auto", "nvml", "dcgm", "sim"], default="auto", help="where readings come from")
    p.add_argument("--listen", default="0.0.0.0:9410", help="address to serve on, host:port")
    p.add_argument("--interval", type=positive_duration, default=1.0, help="collection interval (1s, 500ms, ...)")
    p.add_argument("--node", default=None, help="node name in every series (default: the host name)")
    p.add_argument("--dcgm-url", default="http://127.0.0.1:9400/metrics", help="dcgm-exporter /metrics URL")
    p.add_argument("--dcgm-compat", action="store_true", help="also export dcgm-exporter-named families")
    p.add_argument("--job-map-dir", default=None, help="Slurm prolog files named by GPU UUID or index")
    p.add_argument("--proc-root", default="/proc", help="where to read processes' cgroup, status and comm")
    p.add_argument("--web-config", default=None, help="TLS and basic-auth config (exporter-toolkit YAML)")
    p.add_argument("--scenario", default=None, help="scenario TOML for --source sim")
    p.add_argument("--speed", type=positive_float, default=1.0, help="virtual time speed-up for --source sim")
    p.add_argument("--all-nodes", action="store_true", help="--source sim: serve every node at /node/<name>/")
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info", help="logging verbosity"
    )
    apply_env_twins(p, "GPULENS_EXPORTER_")
    p.set_defaults(func=_run_exporter)


def _run_exporter(args: argparse.Namespace) -> int:
    from exporter.app import ExporterOptions, run_exporter

    options = ExporterOptions(
        source=args.source,
        listen=args.listen,
        interval_s=args.interval,
        node=args.node or socket.gethostname(),
        node_given=args.node is not None,
        dcgm_url=args.dcgm_url,
        dcgm_compat=args.dcgm_compat,
        job_map_dir=args.job_map_dir,
        proc_root=args.proc_root,
        web_config=args.web_config,
        scenario=args.scenario,
        speed=args.speed,
        all_nodes=args.all_nodes,
    )
    return run_exporter(options, announce=lambda line: print(line, file=sys.stderr, flush=True))


COLLECTOR_EXAMPLES = """\
examples:
  # everything from a config file (docs/configuration.md)
  gpulens collector --config gpulens.toml
  # a quick start: two exporters into the default SQLite file, every 5 seconds
  gpulens collector --target http://gpu-node-07:9410 --target http://gpu-node-08:9410 --interval 5s
  # a dcgm-exporter is given by its /metrics URL
  gpulens collector --target http://gpu-node-09:9400/metrics
  # one of four collectors sharing a cluster, writing to PostgreSQL (password from the environment)
  GPULENS_DB_URL=postgresql+psycopg://gpulens:secret@db/gpulens gpulens collector --config gpulens.toml --shard 1/4
"""

QUERY_EXAMPLES = """\
examples:
  gpulens query latest                               # the latest reading of every GPU
  gpulens query latest --json | jq '.[] | select(.utilization_ratio < 0.1)'
  gpulens query series --gpu GPU-1234 --field utilization_ratio --field power_watts --since 1h
  gpulens query jobs --since 24h
  gpulens query targets --config gpulens.toml
"""

MAIN_EXAMPLES = """\
examples:
  gpulens exporter                       # run the node agent on a GPU node
  gpulens exporter --source sim --scenario examples/scenarios/healthy.toml --all-nodes
  gpulens collector --target http://127.0.0.1:9410 --interval 5s
  gpulens query latest
  gpulens <command> --help               # every flag, with its GPULENS_<COMMAND>_* twin
"""


def _add_db_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="gpulens.toml (docs/configuration.md)")
    p.add_argument("--db", default=None, help="database URL (overrides the config; GPULENS_DB_URL also works)")


def _settings(args: argparse.Namespace) -> Any:
    from gpulens.settings import default_settings, load_settings

    settings = load_settings(args.config) if args.config else default_settings()
    if getattr(args, "db", None):
        settings = dataclasses.replace(settings, db_url=args.db)
    return settings


def _add_collector(sub: Any) -> None:
    p = sub.add_parser(
        "collector",
        help="scrape every node on a schedule and keep the history in SQL",
        description="Scrapes gpulens exporters and dcgm-exporters concurrently, writes each round to SQLite or "
        "PostgreSQL (spooling to disk while the database is unreachable) and serves its own /metrics.",
        epilog=COLLECTOR_EXAMPLES,
        formatter_class=_Formatter,
    )
    _add_db_flags(p)
    p.add_argument("--target", action="append", default=[], help="exporter base URL or dcgm /metrics URL; repeatable")
    p.add_argument("--interval", type=positive_duration, default=None, help="scrape interval (default 10s)")
    p.add_argument("--shard", default=None, help="I/N: scrape the targets whose name hashes to I")
    p.add_argument("--listen", default=None, help="where to serve the collector's /metrics (default 127.0.0.1:9411)")
    p.add_argument("--spool-dir", default=None, help="where rounds wait while the database is down")
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info", help="logging verbosity"
    )
    apply_env_twins(p, "GPULENS_COLLECTOR_")
    p.set_defaults(func=_run_collector)


def collector_settings(args: argparse.Namespace) -> Any:
    from gpulens.settings import TargetSettings, parse_shard

    settings = _settings(args)
    changes: dict[str, Any] = {}
    if args.target:
        extra = []
        for url in args.target:
            if not url.startswith(("http://", "https://")):
                raise UsageError(f"--target {url!r}: expected an http:// or https:// URL")
            url = url.rstrip("/")
            kind = "dcgm" if url.endswith("/metrics") else "gpulens"
            extra.append(TargetSettings(url=url, name=url, kind=kind))
        changes["targets"] = (*settings.targets, *extra)
    if args.interval is not None:
        changes["interval_s"] = args.interval
        changes["timeout_s"] = min(settings.timeout_s, args.interval)
    if args.shard is not None:
        try:
            changes["shard"] = parse_shard(args.shard)
        except ValueError as exc:
            raise UsageError(f"--shard: {exc}") from None
    if args.listen is not None:
        changes["listen"] = args.listen
    if args.spool_dir is not None:
        changes["spool_dir"] = args.spool_dir
    return dataclasses.replace(settings, **changes)


def _run_collector(args: argparse.Namespace) -> int:
    from alerts.service import AlertService, alerting_config
    from storage.app import run_collector

    settings = collector_settings(args)
    if not settings.targets and not settings.file_sd:
        raise UsageError("no targets: give --target URL or a --config with [[targets]] or [[file_sd]]")
    alerting = alerting_config(settings)  # validated before anything starts

    def hooks(db: Any) -> list[Any]:
        return [AlertService(db, alerting).hook]

    return run_collector(settings, announce=lambda line: print(line, file=sys.stderr, flush=True), hooks=hooks)


def _add_check_config(sub: Any) -> None:
    p = sub.add_parser(
        "check-config",
        help="validate a gpulens.toml",
        description="Validates a config file; every error names the file, the key and the line.",
        epilog="example:\n  gpulens check-config /etc/gpulens/gpulens.toml\n",
        formatter_class=_Formatter,
    )
    p.add_argument("file", help="the config file")
    p.set_defaults(func=_run_check_config)


def _run_check_config(args: argparse.Namespace) -> int:
    from alerts.service import alerting_config
    from gpulens.settings import load_settings

    settings = load_settings(args.file)
    alerting = alerting_config(settings)
    from gpulens.httpfetch import redact_url

    print(
        f"{args.file}: OK ({len(settings.targets)} targets, {len(settings.file_sd)} file_sd, "
        f"{len(alerting.rules)} alert rules, {len(alerting.receivers)} receivers, "
        f"database {redact_url(settings.db_url)})"
    )
    return 0


def _add_db(sub: Any) -> None:
    p = sub.add_parser(
        "db",
        help="database maintenance",
        description="Database maintenance.",
        epilog="example:\n  gpulens db upgrade --db postgresql+psycopg://gpulens@db/gpulens\n",
        formatter_class=_Formatter,
    )
    dbsub = p.add_subparsers(dest="db_command", metavar="ACTION", parser_class=_Parser)
    dbsub.required = True
    up = dbsub.add_parser("upgrade", help="apply the schema migrations (also done at collector start-up)")
    _add_db_flags(up)
    up.set_defaults(func=_run_db_upgrade)


def _run_db_upgrade(args: argparse.Namespace) -> int:
    from storage.app import open_database

    db = open_database(_settings(args))
    try:
        print(f"{db.url_redacted}: schema up to date")
    finally:
        db.close()
    return 0


def _add_query(sub: Any) -> None:
    p = sub.add_parser(
        "query",
        help="read the stored history from the command line",
        description="Reads the store: a readable table, or with --json one JSON array whose field names are the "
        "exporter's catalogue names (memory_used_bytes, utilization_ratio, node, uuid, job_id, ...).",
        epilog=QUERY_EXAMPLES,
        formatter_class=_Formatter,
    )
    qsub = p.add_subparsers(dest="what", metavar="WHAT", parser_class=_Parser)
    qsub.required = True
    for name, help_text in (
        ("latest", "the latest reading of every GPU"),
        ("series", "one or more fields of one or more GPUs over time"),
        ("jobs", "per-job aggregates"),
        ("targets", "the health of every scrape target"),
    ):
        q = qsub.add_parser(name, help=help_text, epilog=QUERY_EXAMPLES, formatter_class=_Formatter)
        _add_db_flags(q)
        q.add_argument("--json", action="store_true", help="print one JSON array")
        if name in ("series", "jobs"):
            q.add_argument("--since", type=positive_duration, default=3600.0, help="how far back (1h, 24h, 7d)")
        if name == "series":
            q.add_argument("--gpu", action="append", required=True, help="GPU UUID; repeatable")
            q.add_argument("--field", action="append", required=True, help="field name; repeatable")
            q.add_argument("--points", type=int, default=100, help="at most this many points per series")
        q.set_defaults(func=_run_query)


def _run_query(args: argparse.Namespace) -> int:
    from storage.app import open_existing_database
    from storage.cliquery import run_query

    db = open_existing_database(_settings(args))
    try:
        sys.stdout.write(run_query(db, args))
    finally:
        db.close()
    return 0


DEMO_EXAMPLES = """\
examples:
  gpulens demo                                       # 4 nodes x 8 H100, dashboard at http://127.0.0.1:8050
  gpulens demo --speed 10                            # faults arrive 10x sooner
  gpulens demo --scenario examples/scenarios/faults.toml --port 8080
  GPULENS_SLACK_WEBHOOK_URL=https://hooks.slack.com/services/... gpulens demo   # alerts to Slack
"""


def _add_demo(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole stack on a simulated cluster",
        description="Starts simulated exporters (one process per node), the collector with the alert engine "
        "writing to SQLite, and the dashboard; prints the URLs; Ctrl-C stops everything.",
        epilog=DEMO_EXAMPLES,
        formatter_class=_Formatter,
    )
    p.add_argument("--scenario", default=None, help="scenario TOML (default: the bundled demo scenario)")
    p.add_argument("--speed", type=positive_float, default=2.0, help="virtual time runs this many times faster")
    p.add_argument("--db", default=None, help="database URL (default: SQLite in the work directory)")
    p.add_argument("--port", type=int, default=8050, help="dashboard port")
    p.add_argument("--workdir", default=".gpulens-demo", help="where the database, config and logs go")
    p.add_argument("--webhook-url", default=None, help="also send alerts to this generic webhook")
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="warning", help="logging verbosity"
    )
    apply_env_twins(p, "GPULENS_DEMO_")
    p.set_defaults(func=_run_demo)


def _run_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gpulens.demo import DemoOptions, run_demo

    options = DemoOptions(
        scenario=Path(args.scenario) if args.scenario else None,
        speed=args.speed,
        db_url=args.db,
        port=args.port,
        workdir=Path(args.workdir),
        webhook_url=args.webhook_url,
    )
    try:
        return run_demo(options, announce=lambda line: print(line, flush=True))
    except RuntimeError as exc:
        raise CliError(str(exc).splitlines()[0] + f" (logs in {args.workdir}/)") from None


SIMULATE_EXAMPLES = """\
examples:
  gpulens simulate examples/scenarios/stall.toml
  gpulens simulate examples/scenarios/faults.toml --json | jq '.[].alertname'
  gpulens simulate my-cluster.toml --rules my-rules.toml       # test your own rules, like promtool test rules
  gpulens simulate examples/scenarios/demo.toml --db sqlite:///demo.db   # keep the data for the dashboard
"""


def _add_simulate(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="run a scenario in virtual time and report the alerts that fired",
        description="Runs a scenario file (docs/scenarios.md) in virtual time through the production source, ingest, "
        "storage and alert-rule code, as fast as the CPU allows, and reports the alerts that fired. Times are the "
        "scenario's virtual time.",
        epilog=SIMULATE_EXAMPLES,
        formatter_class=_Formatter,
    )
    p.add_argument("scenario", help="scenario TOML")
    p.add_argument("--db", default=None, help="keep the data in this database (default: a temporary SQLite file)")
    p.add_argument("--rules", default=None, help="a file of [[rules]] tables: user rules to test with the builtins")
    p.add_argument("--json", action="store_true", help="print one JSON array of the alerts that fired")
    apply_env_twins(p, "GPULENS_SIMULATE_")
    p.set_defaults(func=_run_simulate)


def _run_simulate(args: argparse.Namespace) -> int:
    import json

    from gpulens.simulate import simulate

    report = simulate(
        args.scenario,
        db_url=args.db,
        rules_path=args.rules,
        progress=None if args.json else (lambda line: print(line, file=sys.stderr, flush=True)),
    )
    if args.json:
        print(json.dumps(report.alerts, indent=2))
    else:
        print(report.table)
        print(
            f"\n{len(report.alerts)} alerts; {report.rounds} rounds of {report.gpus} GPUs in {report.seconds:.1f}s",
            file=sys.stderr,
        )
    return 0


def _add_rules(sub: Any) -> None:
    p = sub.add_parser(
        "rules",
        help="the built-in alert rules",
        description="The built-in alert rules, as the collector evaluates them or as a Prometheus rules file.",
        epilog="examples:\n  gpulens rules export --format prometheus > gpulens-rules.yml\n"
        "  gpulens rules export --format prometheus --config gpulens.toml   # with your threshold overrides\n",
        formatter_class=_Formatter,
    )
    rsub = p.add_subparsers(dest="rules_command", metavar="ACTION", parser_class=_Parser)
    rsub.required = True
    export = rsub.add_parser("export", help="print the rules in another system's format")
    export.add_argument("--format", choices=["prometheus"], default="prometheus", help="output format")
    export.add_argument("--config", default=None, help="gpulens.toml whose [alerts] overrides apply")
    export.set_defaults(func=_run_rules_export)


def _run_rules_export(args: argparse.Namespace) -> int:
    from alerts.promexport import prometheus_rules_yaml
    from alerts.service import alerting_config
    from gpulens.settings import default_settings, load_settings

    settings = load_settings(args.config) if args.config else default_settings()
    sys.stdout.write(prometheus_rules_yaml(alerting_config(settings).rules))
    return 0


def _add_silence(sub: Any) -> None:
    p = sub.add_parser(
        "silence",
        help="mute alerts for a while",
        description="Silences mute the notifications of matching alerts (they keep their state and stay on the "
        "dashboard). Matchers are label=value, label!=value, label=~regex or label!~regex.",
        epilog='examples:\n  gpulens silence add --match node=node-01 --duration 2h --comment "draining for repairs"\n'
        "  gpulens silence list\n  gpulens silence expire 3\n",
        formatter_class=_Formatter,
    )
    ssub = p.add_subparsers(dest="silence_command", metavar="ACTION", parser_class=_Parser)
    ssub.required = True
    add = ssub.add_parser("add", help="add a silence")
    _add_db_flags(add)
    add.add_argument("--match", action="append", required=True, help="label matcher; repeatable (all must match)")
    add.add_argument("--duration", type=positive_duration, required=True, help="how long (30m, 2h, 1d)")
    add.add_argument("--comment", required=True, help="why (shown with the silence)")
    add.add_argument("--author", default=None, help="who (default: the login name)")
    add.set_defaults(func=_run_silence)
    lst = ssub.add_parser("list", help="list active silences")
    _add_db_flags(lst)
    lst.add_argument("--all", action="store_true", help="include expired silences")
    lst.add_argument("--json", action="store_true", help="print one JSON array")
    lst.set_defaults(func=_run_silence)
    exp = ssub.add_parser("expire", help="end a silence now")
    _add_db_flags(exp)
    exp.add_argument("id", type=int, help="the silence's id (from silence list)")
    exp.set_defaults(func=_run_silence)


def _run_silence(args: argparse.Namespace) -> int:
    import getpass
    import json
    import time

    from alerts.matchers import MatcherError, parse_matcher
    from gpulens.table import render_table
    from storage import alertstore
    from storage.app import open_database

    now = time.time()
    if args.silence_command == "add":
        try:
            matchers = [parse_matcher(m) for m in args.match]
        except MatcherError as exc:
            raise UsageError(f"--match: {exc}") from None
    db = open_database(_settings(args))
    try:
        if args.silence_command == "add":
            author = args.author or getpass.getuser()
            silence_id = alertstore.add_silence(
                db,
                matchers=[m.to_json() for m in matchers],
                starts_at=now,
                ends_at=now + args.duration,
                comment=args.comment,
                created_by=author,
                now=now,
            )
            print(f"silence {silence_id} added until {format_timestamp(now + args.duration)}")
        elif args.silence_command == "expire":
            if not alertstore.expire_silence(db, args.id, now):
                raise CliError(f"no active silence {args.id}")
            print(f"silence {args.id} expired")
        else:
            rows = [
                {
                    "id": r.id,
                    "matchers": " ".join(f"{m['name']}{m['op']}{m['value']}" for m in r.matchers),
                    "starts_at": r.starts_at,
                    "ends_at": r.ends_at,
                    "created_by": r.created_by,
                    "comment": r.comment,
                }
                for r in alertstore.list_silences(db, now=now, include_expired=args.all)
            ]
            print(json.dumps(rows) if args.json else render_table(rows), end="" if not args.json else "\n")
    finally:
        db.close()
    return 0


def _add_alerts(sub: Any) -> None:
    p = sub.add_parser(
        "alerts",
        help="alerting tools",
        description="Alerting tools.",
        epilog="example:\n  gpulens alerts test-notify ops-slack --config gpulens.toml\n",
        formatter_class=_Formatter,
    )
    asub = p.add_subparsers(dest="alerts_command", metavar="ACTION", parser_class=_Parser)
    asub.required = True
    test = asub.add_parser("test-notify", help="send a test notification to a receiver now")
    test.add_argument("receiver", help="a receiver name from [[alerts.receivers]]")
    test.add_argument("--config", required=True, help="gpulens.toml with the receiver")
    test.set_defaults(func=_run_test_notify)


def _run_test_notify(args: argparse.Namespace) -> int:
    import time

    from alerts.config import build_notifiers
    from alerts.notify import DeliveryError, probe_notification
    from alerts.service import alerting_config
    from gpulens.settings import load_settings

    config = alerting_config(load_settings(args.config))
    notifiers = build_notifiers(config.receivers, dashboard_url=config.dashboard_url)
    notifier = notifiers.get(args.receiver)
    if notifier is None:
        raise CliError(f"no receiver {args.receiver!r} (the config has: {', '.join(notifiers) or 'none'})")
    note = probe_notification(args.receiver, time.time())
    try:
        notifier.send(note.alerts, group_labels=note.group_labels, status=note.status, group_key=note.group_key)
    except DeliveryError as exc:
        raise CliError(exc.message) from None
    print(f"test notification delivered to {args.receiver}")
    return 0


DASHBOARD_EXAMPLES = """\
examples:
  gpulens dashboard --config gpulens.toml                 # http://127.0.0.1:8050
  gpulens dashboard --db sqlite:///gpulens.db --listen 0.0.0.0:8050 --basic-auth-file /etc/gpulens/htpasswd
"""


def _add_dashboard(sub: Any) -> None:
    p = sub.add_parser(
        "dashboard",
        help="serve the web UI over the stored history",
        description="The web UI: cluster overview, nodes and GPUs, jobs, interconnect and alerts. It reads the store "
        "the collector writes; bound to 127.0.0.1 unless told otherwise.",
        epilog=DASHBOARD_EXAMPLES,
        formatter_class=_Formatter,
    )
    _add_db_flags(p)
    p.add_argument("--listen", default="127.0.0.1:8050", help="where to serve, host:port")
    p.add_argument("--basic-auth-file", default=None, help="htpasswd-style file of user:bcrypt-hash lines")
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info", help="logging verbosity"
    )
    apply_env_twins(p, "GPULENS_DASHBOARD_")
    p.set_defaults(func=_run_dashboard)


def _run_dashboard(args: argparse.Namespace) -> int:
    from alerts.service import SqlAlertReader
    from dashboard.server import run_dashboard
    from exporter.server import parse_listen

    try:
        host, port = parse_listen(args.listen)
    except ValueError as exc:
        raise UsageError(f"--listen: {exc}") from None
    return run_dashboard(
        _settings(args),
        host=host,
        port=port,
        basic_auth_file=args.basic_auth_file,
        alerts=SqlAlertReader,
        announce=lambda line: print(line, file=sys.stderr, flush=True),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpulens",
        description="gpulens: monitoring and observability for NVIDIA GPU clusters.",
        epilog=MAIN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpulens {gpulens.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    _add_exporter(sub)
    _add_collector(sub)
    _add_check_config(sub)
    _add_db(sub)
    _add_query(sub)
    _add_demo(sub)
    _add_simulate(sub)
    _add_rules(sub)
    _add_silence(sub)
    _add_alerts(sub)
    _add_dashboard(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, str(getattr(args, "log_level", "warning")).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("apscheduler", "alembic"):  # a line per scheduled run / migration step is not news
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    command = f"gpulens {args.command}"
    try:
        result: int = args.func(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (CliError, ConfigError, SourceError) as exc:
        print(f"{command}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{command}: error: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return result


if __name__ == "__main__":
    sys.exit(main())
