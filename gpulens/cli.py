"""The ``gpulens`` command line. The only place that prints errors and chooses exit codes.

Each subcommand's flags have an environment twin, ``GPULENS_<COMMAND>_<FLAG>`` (``--listen`` of ``gpulens exporter``
is ``GPULENS_EXPORTER_LISTEN``); a flag on the command line wins over its twin.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import gpulens
from gpulens.config import ConfigError, parse_duration
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


MAIN_EXAMPLES = """\
examples:
  gpulens exporter                       # run the node agent on a GPU node
  gpulens exporter --source sim --scenario examples/scenarios/healthy.toml --all-nodes
  gpulens exporter --help                # every flag, with its GPULENS_EXPORTER_* twin
"""


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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, str(getattr(args, "log_level", "info")).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    command = f"gpulens {args.command}"
    try:
        result: int = args.func(args)
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
