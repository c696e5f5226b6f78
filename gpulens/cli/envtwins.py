"""Environment twins: every flag of ``gpulens <command>`` can also be set as ``GPULENS_<COMMAND>_<FLAG>``."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from gpulens.cli.base import UsageError

_TRUE = {"1", "true", "yes", "on"}


_FALSE = {"0", "false", "no", "off", ""}


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
        if isinstance(action, argparse._StoreTrueAction | argparse.BooleanOptionalAction):
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
