"""What the store cannot serve, said in one line: a page asks the store for a read and, where the store raises
``NotAvailableOnBackend`` (``gpulens.storage.reading``), shows the line instead of that part, never asking which
kind of store it reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from dash import html

from gpulens.storage.reading import NotAvailableOnBackend

T = TypeVar("T")
Missing = NotAvailableOnBackend


def attempt(read: Callable[[], T]) -> T | Missing:
    """``read()``, or the ``NotAvailableOnBackend`` it raised."""
    try:
        return read()
    except NotAvailableOnBackend as exc:
        return exc


def missing_of(*results: object) -> list[Missing]:
    """The reads among ``results`` (from ``attempt``) that the store could not serve."""
    return [r for r in results if isinstance(r, NotAvailableOnBackend)]


def not_available(missing: Sequence[Missing]) -> html.Div | None:
    """One line naming what the store cannot serve: the error's own words for one read ("Drain actions: not available
    on Prometheus (...)"), the reads by name for several; None when nothing is missing."""
    if not missing:
        return None
    if len(missing) == 1:
        text = str(missing[0])
    else:
        backends = dict.fromkeys(m.backend for m in missing)
        text = f"Not available on {' or '.join(backends)}: {', '.join(m.what for m in missing)}"
    return html.Div(text, className="gl-empty gl-not-available")
