"""``PromReader.nic_problems``: every RDMA port's problems (``gpulens.storage.portproblems``) told by Prometheus.

At once: every port's state, rate and width (``latest_nics`` of those three fields: down and degraded are told
from them as the SQL store tells them, since degraded compares a port with the best of its node's ports of its
link layer, a join Prometheus evaluates slower than gpulens decodes the four small fields), and queries that return
only the ports with a problem, as comparisons in PromQL: saturated (a direction's rate at ``SATURATED_AT`` of the
link speed or more, at the instant ``latest_nics`` reads), errors (an error counter's rate above zero at one of the
``ERROR_POINTS`` steps ``nic_series`` reads the error rates at, one query per counter, of the ports whose error
counters stand above zero now, one query). Each compares the values ``latest_nics`` and ``nic_series`` read, so
the answer is the SQL store's. Where few ports have a problem the answers are four series per port and a few;
where every port has one (the bench's history: every error counter grows, every width wobbles) they are about as
large as the reads they replace, and Prometheus spends about as much CPU on them.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Final

from gpulens.storage.portproblems import ERROR_FIELDS, ERROR_POINTS, SATURATED_AT, problems_of
from gpulens.storage.prometheus.client import PromSeries, quote
from gpulens.storage.prometheus.fabric import NIC_FIELDS, PromReader, _nic_key, _window, latest_nics

PORT: Final = "node, device, port"
# what down and degraded are told from
STATE_FIELDS: Final = ("up", "rate_bytes_per_second", "link_width")


def saturated_query(reader: PromReader) -> str:
    """The instant PromQL of the ports with a direction at ``SATURATED_AT`` of their link speed or more."""
    speed = NIC_FIELDS["rate_bytes_per_second"][0]
    return " or ".join(
        f"(rate({NIC_FIELDS[f][0]}{_window(reader)}) / on ({PORT}) ({speed} > 0) >= {SATURATED_AT:g})"
        for f in ("transmit_bytes_per_second", "receive_bytes_per_second")
    )


def counted_query() -> str:
    """The instant PromQL of the ports whose error counters stand above zero (the ports ``error_rates`` reads)."""
    names = quote("|".join(NIC_FIELDS[f][0] for f in ERROR_FIELDS))
    return f"count by ({PORT}) ({{__name__=~{names}}} != 0)"


def rose_queries(reader: PromReader, step: float) -> list[str]:
    """The range PromQL, one per error counter, of the ports whose counter rose at a step (``nic_series``'s rates;
    each apart, and no aggregation: Prometheus evaluates either slower than gpulens decodes the answers)."""
    return [f"rate({NIC_FIELDS[f][0]}{_window(reader, step)}) > 0" for f in ERROR_FIELDS]


def _keys(answer: list[PromSeries]) -> set[tuple[str, str, int]]:
    return {key for s in answer if (key := _nic_key(s.labels)) is not None}


def rose_ports(reader: PromReader, lo: float, hi: float, step: float) -> set[tuple[str, str, int]]:
    """The ports whose error counters rose at a step of (``lo``, ``hi``] (``nic_series``'s rates) and stand above
    zero now: the ports with errors in the range."""
    client = reader.client
    with ThreadPoolExecutor(4) as pool:
        counted = pool.submit(client.query, counted_query(), reader.clock.now())
        rose = [pool.submit(client.query_range, q, lo + step, hi + step, step) for q in rose_queries(reader, step)]
        return set().union(*(_keys(r.result()) for r in rose)) & _keys(counted.result())


def nic_problems(reader: PromReader, start: float, end: float) -> dict[str, tuple[str, ...]]:
    now = reader.clock.now()
    lo, hi, step = reader._step(start, end, ERROR_POINTS)  # the steps ``nic_series`` reads the error rates at
    with ThreadPoolExecutor(2) as pool:
        busy = pool.submit(reader.client.query, saturated_query(reader), now)
        rose = pool.submit(rose_ports, reader, lo, hi, step)
        nics = latest_nics(reader, node=None, max_age_s=None, fields=STATE_FIELDS)
        saturated = _keys(busy.result())
        errors = rose.result()
    return problems_of(
        nics,
        lambda n: (n.node, n.device, n.port) in errors,
        lambda n: bool(n.up) and (n.node, n.device, n.port) in saturated,
    )
