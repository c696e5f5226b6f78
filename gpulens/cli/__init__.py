"""The ``gpulens`` command line and process wiring: the top layer, the only one that composes every component.

One module per command (``cmd_*.py``), plus what they share: ``base`` (errors, parser classes, flag types),
``envtwins`` (``GPULENS_<COMMAND>_<FLAG>``), ``lifecycle`` (signals), ``demo_stack``, ``simulation``, ``query_print``
and ``table``. No component imports this package.
"""

from __future__ import annotations

from gpulens.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
