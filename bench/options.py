"""The command line of a benchmark module: ``--help`` says what it measures, and an unknown argument is an error.

Every ``bench_*`` module builds its parser here, so ``python -m bench.bench_x --help`` prints the module's own
description (its docstring) and an example, instead of starting a run that may take minutes.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def parser(module: str, doc: str | None, *examples: str) -> argparse.ArgumentParser:
    """A parser for ``python -m <module>``: the docstring's first paragraph as the description, the rest and the
    ``examples`` (argument strings, without the command) after the options."""
    prog = f"python -m {module}"
    text = (doc or "").strip()
    first, _, rest = text.partition("\n\n")
    lines = [rest.strip()] if rest.strip() else []
    if examples:
        lines.append("examples:\n" + "\n".join(f"  {prog} {e}".rstrip() for e in examples))
    return argparse.ArgumentParser(
        prog=prog,
        description=" ".join(first.split()),
        epilog="\n\n".join(lines) or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def no_arguments(module: str, doc: str | None, argv: Sequence[str] | None = None) -> None:
    """For a benchmark that takes no arguments: answer ``--help``, and refuse anything else (exit status 2)."""
    parser(module, doc, "").parse_args(argv)
