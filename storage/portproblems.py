"""What is wrong with each RDMA port now, from its newest reading and its error rate over a range: down, degraded
(its rate or width below the best its node's ports of the same link layer reached), errors (its error counters rose
in the range), saturated (a direction at ``SATURATED_AT`` of its rate or more). The pages rank ports by these
(``gpulens.dashboard.fabric``); the stores answer ``nic_problems`` for every port by them: the SQL store from every
port's reading (:func:`nic_problems`), Prometheus by comparisons in PromQL that return the ports with a problem
only (``gpulens.storage.prometheus.problems``), both to the same answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final, Protocol

from gpulens.fabricmodel import NicReading
from gpulens.ratios import share
from gpulens.storage.records import SeriesData


class StoreReader(Protocol):
    """What these reads use of ``gpulens.storage.reading.StoreReader`` (which calls them)."""

    def latest_nics(
        self,
        *,
        node: str | None = None,
        max_age_s: float | None = None,
        fields: Sequence[str] | None = None,
        nodes: Sequence[str] | None = None,
    ) -> list[NicReading]: ...

    def nic_series(
        self, nic_ids: Sequence[str], fields: Sequence[str], start: float, end: float, max_points: int = 1000
    ) -> dict[str, SeriesData]: ...


# The error counters a port's error rate adds up (per second over the range; the store returns counters as rates).
# A link going down is the port's state (and the flapping alert's business), not an error count.
ERROR_FIELDS: Final = ("symbol_errors_total", "receive_errors_total", "local_link_integrity_errors_total")
ERROR_POINTS: Final = 4  # an error rate over the range needs only a few buckets
SATURATED_AT: Final = 0.9  # a direction at 90 % of the port's rate or more
# The problems a store tells of a port (``nic_problems``), in the order a table ranks them.
PORT_PROBLEMS: Final = ("down", "degraded", "errors", "saturated")
# The port fields the problems are told from.
PROBLEM_FIELDS: Final = (
    "up",
    "rate_bytes_per_second",
    "link_width",
    "transmit_bytes_per_second",
    "receive_bytes_per_second",
    *ERROR_FIELDS,
)


def best_links(nics: Iterable[NicReading]) -> dict[tuple[str, str | None], tuple[float, int]]:
    """Per (node, link layer), the highest rate and width any of its ports that are up negotiated."""
    best: dict[tuple[str, str | None], tuple[float, int]] = {}
    for n in nics:
        if not n.up:
            continue
        rate, width = best.get((n.node, n.link_layer), (0.0, 0))
        best[(n.node, n.link_layer)] = (max(rate, n.rate_bytes_per_second or 0.0), max(width, n.link_width or 0))
    return best


def shortfall(nic: NicReading, best: tuple[float, int]) -> tuple[str, float, float] | None:
    """Why an up port is degraded: ("width", its width, the best) or ("rate", its rate, the best), against the best
    its node's ports of the same kind reached (sysfs gives no port maximum; a node's ports are cabled alike). None
    when it is not."""
    rate, width = best
    if not nic.up:
        return None
    if nic.link_width and width and nic.link_width < width:
        return ("width", nic.link_width, width)
    if nic.rate_bytes_per_second and rate and nic.rate_bytes_per_second < rate * 0.99:
        return ("rate", nic.rate_bytes_per_second, rate)
    return None


def loads(nic: NicReading) -> tuple[float | None, float | None]:
    """The port's transmit and receive traffic as shares of its rate (None when down or unknown)."""
    if not nic.up:
        return None, None
    return (
        share(nic.transmit_bytes_per_second, nic.rate_bytes_per_second),
        share(nic.receive_bytes_per_second, nic.rate_bytes_per_second),
    )


def counted_errors(nic: NicReading) -> bool:
    """Whether any of the port's error counters stands above zero (only those can have risen in a range)."""
    return any(getattr(nic, f) for f in ERROR_FIELDS)


def error_rates(store: StoreReader, nics: Sequence[NicReading], start: float, end: float) -> dict[str, float]:
    """Errors per second over [start, end] of the ports that have counted any error: one query, for those ports
    only (a counter that stands at zero cannot have risen in the range), a few buckets each."""
    counted = [n.id for n in nics if counted_errors(n)]
    if not counted:
        return {}
    series = store.nic_series(counted, ERROR_FIELDS, start, end, ERROR_POINTS)
    return {nic: _mean_sum(data) for nic, data in series.items()}


def _mean_sum(data: SeriesData) -> float:
    """The mean over the buckets of the sum of the error rates (a bucket with no value adds nothing)."""
    if not data.timestamps:
        return 0.0
    total = 0.0
    for f in ERROR_FIELDS:
        total += sum(v for v in data.values.get(f, ()) if v is not None)
    return total / len(data.timestamps)


def saturated(nic: NicReading) -> bool:
    """Whether a direction of the port's traffic is at ``SATURATED_AT`` of its rate or more."""
    tx, rx = loads(nic)
    return max(tx or 0.0, rx or 0.0) >= SATURATED_AT


def problems_of(
    nics: Sequence[NicReading], errors: Callable[[NicReading], bool], busy: Callable[[NicReading], bool]
) -> dict[str, tuple[str, ...]]:
    """Every port's problems (of ``PORT_PROBLEMS``, in that order) by nic id: down and degraded from ``nics``
    (their ``up``, link layer, rate and width), errors and saturated as ``errors`` and ``busy`` say."""
    best = best_links(nics)
    out = {}
    for n in nics:
        found = {
            "down": not n.up,
            "degraded": shortfall(n, best.get((n.node, n.link_layer), (0.0, 0))) is not None,
            "errors": errors(n),
            "saturated": busy(n),
        }
        out[n.id] = tuple(p for p in PORT_PROBLEMS if found[p])
    return out


def port_problems(nics: Sequence[NicReading], rates: Mapping[str, float]) -> dict[str, tuple[str, ...]]:
    """Every port's problems by nic id from its reading; ``rates``: error rates by nic id (:func:`error_rates`)."""
    return problems_of(nics, lambda n: bool(rates.get(n.id)), saturated)


def nic_problems(store: StoreReader, start: float, end: float) -> dict[str, tuple[str, ...]]:
    """``StoreReader.nic_problems`` from every port's newest reading and the error rates of those that counted
    errors (a store that reads a port's fields in one row: SQL)."""
    nics = store.latest_nics(fields=PROBLEM_FIELDS)
    return port_problems(nics, error_rates(store, nics, start, end))
