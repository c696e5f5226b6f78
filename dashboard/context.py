"""What every page's callbacks share: the database, the clock, and an honest account of what went wrong."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from dash import html

from gpulens.clock import Clock
from gpulens.dashboard import snapshot
from gpulens.dashboard.alertdata import AlertReader
from gpulens.dashboard.components import banner
from gpulens.dashboard.timerange import CUSTOM, RangeError, minute_text
from gpulens.gcpause import gc_paused
from gpulens.settings import Prices
from gpulens.storage.db import Database, DatabaseUnavailableError
from gpulens.storage.reading import NotAvailableOnBackend, StoreReader, TooManySeriesError
from gpulens.storage.sqlreader import reader_of

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Context:
    db: Database | StoreReader  # the store the pages read (a Database is read through ``SqlReader``)
    clock: Clock
    alerts: AlertReader | None = None
    stale_after_s: float = 120.0
    prices: Prices = field(default_factory=Prices)  # [accounting]: a running job's summary on its page
    base: StoreReader = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", reader_of(self.db))

    @property
    def store(self) -> StoreReader:
        """The reader of this page view: inside ``guarded``, one session and snapshot (``dashboard.snapshot``)."""
        pinned = snapshot.current()
        return pinned if pinned is not None else self.base

    def with_recording_notice(self, status: html.Div | None) -> html.Div | None:
        """``status``, and once per dashboard the line naming the recording rules file that would make a page over
        Prometheus faster, when the page just read raw series for want of them (``storage.prometheus.recorded``)."""
        usage = getattr(self.base, "recording", None)
        hint = usage.hint() if usage is not None else None
        if not hint:
            return status
        notice = banner("info", "Faster with recording rules:", " " + hint)
        return notice if status is None else html.Div([status, notice])

    def history_start(self, preset: str | None) -> float | None:
        """Where a custom range must start at the earliest (``timerange.resolve_range``); asked of the store only
        for a custom range."""
        return self.store.history_start() if preset == CUSTOM else None


class PageError(Exception):
    """A page cannot show its data; ``banner`` says why in words an operator can act on, ``as_of`` when."""

    def __init__(self, banner: html.Div, as_of: str) -> None:
        super().__init__("page problem")
        self.banner = banner
        self.as_of = as_of


def guarded(context: Context, load: Callable[[], T]) -> T:
    """Run a page's data loading in one session and snapshot of the store (``gpulens.dashboard.snapshot``); turn each
    failure into a ``PageError`` with a banner.

    The database being down is expected and said plainly (its message carries the URL without the password); any
    other failure is logged with its traceback here and shown only by type, so no detail (or secret) reaches the page.
    """
    as_of = f"as of {minute_text(context.clock.now())}"
    try:
        with snapshot.pinned(context.base), gc_paused():  # a page's records live until it is drawn
            return load()
    except RangeError as exc:
        raise PageError(banner("warn", "Bad time range.", str(exc)), as_of) from None
    except TooManySeriesError as exc:
        raise PageError(banner("warn", "Too many series.", context.store.scrub(str(exc))), as_of) from None
    except NotAvailableOnBackend as exc:
        raise PageError(banner("warn", "Not available on this backend.", str(exc)), as_of) from None
    except DatabaseUnavailableError as exc:
        detail = context.store.scrub(str(exc)) + ". Showing nothing until it is back."
        raise PageError(banner("bad", "Database unreachable.", detail), as_of) from None
    except Exception as exc:
        log.exception("reading the dashboard data failed")
        detail = f"{type(exc).__name__}; the dashboard's log has the details."
        raise PageError(banner("bad", "Could not read the data.", detail), as_of) from None
