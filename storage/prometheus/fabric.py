"""The fabric and host reads of ``PromReader``: RDMA ports, nodes' CPUs and memory and jobs' cgroups from the
``gpulens_nic_*``, ``gpulens_host_*`` and ``gpulens_job_*`` families the node agent exports (docs/metrics.md).

The latest values: the gauges in one query, each rate in one (at once), only the fields asked for; each node's
ports up and in all counted by node in Prometheus (``nic_counts``); over time, one query per field. Port
series carry ``node, device, port`` (``gpulens_nic_info`` adds ``link_layer``, ``gpus`` and ``pci_bus_id``); host
series ``node``; job series ``node, job_id``. Rates come from ``rate()`` over a window of four scrape intervals
(``[database] min_step``; at least a series' step): the bytes, transmit wait and CNP rates of a port, a job's CPU
cores, and the error counters of a port's series. What the families do not hold is ``None`` in the records (a
port's ``state`` and ``phys_state``: only ``up`` is exported; a job's cgroup path). A series reads means per step
(min and max are the same as the mean).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, Protocol

from gpulens.clock import Clock
from gpulens.fabricmodel import HostReading, JobHostReading, NicReading, nic_id, parse_nic_id
from gpulens.storage.prometheus.client import PromClient, PromSeries, quote, regex_of
from gpulens.storage.records import SeriesData, check_nic_fields


class PromReader(Protocol):
    """What these reads use of ``gpulens.storage.prometheus.reader.PromReader`` (which calls them)."""

    client: PromClient
    clock: Clock
    min_step_s: float

    def _step(self, start: float, end: float, max_points: int) -> tuple[float, float, float]: ...


NIC_INFO: Final = "gpulens_nic_info"
NIC_UP: Final = "gpulens_nic_up"
# NicReading field -> (family, how): "gauge" read as it is, "rate" the family's rate per second.
NIC_FIELDS: Final[dict[str, tuple[str, str]]] = {
    "up": (NIC_UP, "gauge"),
    "rate_bytes_per_second": ("gpulens_nic_link_speed_bytes_per_second", "gauge"),
    "link_width": ("gpulens_nic_link_width", "gauge"),
    "transmit_bytes_per_second": ("gpulens_nic_transmit_bytes_total", "rate"),
    "receive_bytes_per_second": ("gpulens_nic_receive_bytes_total", "rate"),
    "transmit_wait_per_second": ("gpulens_nic_transmit_wait_total", "rate"),
    "cnp_handled_per_second": ("gpulens_nic_cnp_handled_total", "rate"),
    **{
        f"{name}_total": (f"gpulens_nic_{name}_total", "gauge")
        for name in (
            "transmit_bytes",
            "receive_bytes",
            "transmit_wait",
            "link_downed",
            "symbol_errors",
            "receive_errors",
            "local_link_integrity_errors",
            "link_error_recovery",
            "transmit_discards",
            "cnp_handled",
        )
    },
}
HOST_FIELDS: Final[dict[str, str]] = {
    "cpus": "gpulens_host_cpus",
    "cpu_busy_ratio": "gpulens_host_cpu_busy_ratio",
    "cpu_iowait_ratio": "gpulens_host_cpu_iowait_ratio",
    "memory_total_bytes": "gpulens_host_memory_total_bytes",
    "memory_used_bytes": "gpulens_host_memory_used_bytes",
    "memory_available_bytes": "gpulens_host_memory_available_bytes",
}
JOB_FIELDS: Final[dict[str, tuple[str, str]]] = {
    "cpu_seconds_total": ("gpulens_job_cpu_seconds_total", "gauge"),
    "cpu_used_cores": ("gpulens_job_cpu_seconds_total", "rate"),
    "cpu_limit_cores": ("gpulens_job_cpu_limit_cores", "gauge"),
    "memory_used_bytes": ("gpulens_job_memory_used_bytes", "gauge"),
    "memory_limit_bytes": ("gpulens_job_memory_limit_bytes", "gauge"),
}
# Series fields: a counter's series is its rate per second, as on the SQL path.
NIC_SERIES: Final = frozenset(
    {"transmit_bytes_per_second", "receive_bytes_per_second", "transmit_wait_per_second", "cnp_handled_per_second"}
    | {"rate_bytes_per_second", "up", "link_width"}
    | {name for name in NIC_FIELDS if name.endswith("_total")}
)
HOST_SERIES: Final = frozenset(HOST_FIELDS) - {"cpus"}
JOB_SERIES: Final = frozenset({"cpu_used_cores", "cpu_limit_cores", "memory_used_bytes", "memory_limit_bytes"})
_INTS: Final = frozenset({"link_width", "cpus", "memory_total_bytes", "memory_used_bytes", "memory_available_bytes"})
_INTS_JOB: Final = frozenset({"memory_used_bytes", "memory_limit_bytes"})


def _selector(family: str, matchers: str) -> str:
    return f"{family}{{{matchers}}}"


def _window(reader: PromReader, step: float = 0.0) -> str:
    return f"[{max(step, 4 * reader.min_step_s):g}s]"


def _instant(reader: PromReader, family: str, how: str, matchers: str) -> str:
    """The PromQL of one field now: a rate between the last two samples in the window (what the exporter's own
    rate between its last two collections is, and so what the SQL store keeps), or a gauge as it is."""
    selected = _selector(family, matchers)
    return f"irate({selected}{_window(reader)})" if how == "rate" else selected


def _ranged(reader: PromReader, family: str, rate: bool, matchers: str) -> Callable[[float], str]:
    """The PromQL of one field over steps: a rate over the step (at least the window), or the step's mean."""
    selected = _selector(family, matchers)
    if rate:
        return lambda step: f"rate({selected}{_window(reader, step)})"
    return lambda step: f"avg_over_time({selected}[{step:g}s])"


def _latest(
    reader: PromReader, fields: Mapping[str, tuple[str, str]], matchers: str, now: float, *, together: bool = True
) -> dict[str, list[PromSeries]]:
    """The latest values of ``fields`` (field -> (family, "gauge" or "rate")), by field, the queries at once: each
    rate in a query of its own, the gauges in one selector if ``together`` (no ``or``: Prometheus's ``or`` of
    many large answers costs more than the reads; ``[database] max_series`` for each family), else one each (a
    large answer: the cluster's ports, where one answer of them all is slower to encode and decode)."""
    gauges: dict[str, list[str]] = defaultdict(list)  # family -> fields
    for field, (family, how) in fields.items():
        if how != "rate" and together:
            gauges[family].append(field)
    limit = reader.client.auth.max_series
    # (the fields of an answer, or None for the gauges, by name), the PromQL, the series allowed
    queries: list[tuple[str | None, str, int]] = [
        (field, _instant(reader, family, how, matchers), limit)
        for field, (family, how) in fields.items()
        if how == "rate" or not together
    ]
    if gauges:
        selected = "{__name__=~" + quote("|".join(sorted(gauges))) + (f", {matchers}" if matchers else "") + "}"
        queries.append((None, selected, limit * len(gauges)))
    with ThreadPoolExecutor(4) as pool:
        futures = [(name, pool.submit(reader.client.query, q, now, max_series=n)) for name, q, n in queries]
        answers = [(name, future.result()) for name, future in futures]
    out: dict[str, list[PromSeries]] = {field: [] for field in fields}
    for named, answer in answers:
        if named is not None:
            out[named] = answer
            continue
        for s in answer:
            for gauge in gauges.get(s.labels.get("__name__", ""), ()):
                out[gauge].append(s)
    return out


def _nic_key(labels: Mapping[str, str]) -> tuple[str, str, int] | None:
    port = labels.get("port", "")
    if not labels.get("node") or not labels.get("device") or not port.isdigit():
        return None
    return (labels["node"], labels["device"], int(port))


def _natural(name: str) -> tuple[str, int]:
    stem = name.rstrip("0123456789")
    return (stem, int(name[len(stem) :]) if len(stem) < len(name) else -1)


def _value(v: float, integer: bool) -> Any:
    if not math.isfinite(v):
        return None
    return round(v) if integer else v


def latest_nics(
    reader: PromReader,
    *,
    node: str | None,
    max_age_s: float | None,
    fields: Sequence[str] | None = None,
    nodes: Sequence[str] | None = None,
) -> list[NicReading]:
    """Every port's newest values of ``fields`` (all ``NIC_FIELDS`` if None; ``up`` always): one query per field
    (the gauges of ``node`` or ``nodes`` in one), the others left ``None``; the ports' labels at the same time."""
    check_nic_fields(fields)
    if nodes is not None and not nodes:
        return []
    wanted = {f: how for f, how in NIC_FIELDS.items() if fields is None or f == "up" or f in fields}
    now = reader.clock.now()
    chosen = ([f"node={quote(node)}"] if node is not None else []) + (
        [f"node=~{regex_of(nodes)}"] if nodes is not None else []
    )
    matchers = ", ".join(chosen)
    with ThreadPoolExecutor(2) as pool:
        info = pool.submit(reader.client.query, _selector(NIC_INFO, matchers), now)
        stamped = f"timestamp({_selector(NIC_UP, matchers)})"
        stamps = None if max_age_s is None else pool.submit(reader.client.query, stamped, now)
        answers = _latest(reader, wanted, matchers, now, together=bool(chosen))
    ports: dict[tuple[str, str, int], dict[str, Any]] = {}
    for s in info.result():
        key = _nic_key(s.labels)
        if key is not None:
            gpus = tuple(int(g) for g in s.labels.get("gpus", "").split(",") if g.strip().isdigit())
            ports[key] = {
                "link_layer": s.labels.get("link_layer") or None,
                "pci_bus_id": s.labels.get("pci_bus_id") or None,
                "gpus": gpus,
            }
    if max_age_s is not None and stamps is not None:
        fresh = {_nic_key(s.labels) for s in stamps.result() if s.value >= now - max_age_s}
        ports = {key: values for key, values in ports.items() if key in fresh}
    for field, answer in answers.items():
        integer = field == "link_width" or field.endswith("_total")
        for s in answer:
            key = _nic_key(s.labels)
            if key in ports:
                ports[key][field] = bool(s.value) if field == "up" else _value(s.value, integer)
    readings = [NicReading(*key, **fields) for key, fields in ports.items()]
    return sorted(readings, key=lambda n: (n.node, _natural(n.device), n.port))


def nic_counts(reader: PromReader) -> dict[str, tuple[int, int]]:
    """Per node, its ports (``gpulens_nic_info`` series) and those up, counted by node in Prometheus (two queries,
    one series per node each)."""
    now = reader.clock.now()
    with ThreadPoolExecutor(2) as pool:
        every = pool.submit(reader.client.query, f"count by (node) ({NIC_INFO})", now)
        up = pool.submit(reader.client.query, f"count by (node) ({NIC_UP} != 0)", now)
        ups = {s.labels.get("node", ""): round(s.value) for s in up.result()}
        return {
            s.labels["node"]: (min(ups.get(s.labels["node"], 0), round(s.value)), round(s.value))
            for s in every.result()
            if s.labels.get("node")
        }


def latest_hosts(reader: PromReader, *, node: str | None) -> list[HostReading]:
    now = reader.clock.now()
    matchers = "" if node is None else f"node={quote(node)}"
    hosts: dict[str, dict[str, Any]] = defaultdict(dict)
    host_fields = {field: (family, "gauge") for field, family in HOST_FIELDS.items()}
    for field, answer in _latest(reader, host_fields, matchers, now).items():
        for s in answer:
            if s.labels.get("node"):
                hosts[s.labels["node"]][field] = _value(s.value, field in _INTS)
    return [HostReading(node, **fields) for node, fields in sorted(hosts.items())]


def latest_job_hosts(reader: PromReader, *, job_id: str | None) -> list[JobHostReading]:
    now = reader.clock.now()
    matchers = "" if job_id is None else f"job_id={quote(job_id)}"
    jobs: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
    for field, answer in _latest(reader, JOB_FIELDS, matchers, now).items():
        for s in answer:
            if s.labels.get("node") and s.labels.get("job_id"):
                jobs[(s.labels["job_id"], s.labels["node"])][field] = _value(s.value, field in _INTS_JOB)
    return [JobHostReading(node, job, **fields) for (job, node), fields in sorted(jobs.items())]


def _check(fields: Sequence[str], known: frozenset[str]) -> None:
    unknown = [f for f in fields if f not in known]
    if unknown:
        raise ValueError(f"unknown fields {', '.join(unknown)}; known: {', '.join(sorted(known))}")


def _series(
    reader: PromReader,
    queries: Mapping[str, Callable[[float], str]],
    key_of: Callable[[Mapping[str, str]], str | None],
    start: float,
    end: float,
    max_points: int,
) -> dict[str, SeriesData]:
    """One range query per field (``queries``: field -> the PromQL for a step), all at once, keyed by
    ``key_of(labels)``."""
    if max_points < 2:
        raise ValueError("max_points must be at least 2")
    if end < start:
        raise ValueError("end is before start")
    lo, hi, step = reader._step(start, end, max_points)
    points: dict[str, dict[str, dict[float, float]]] = defaultdict(lambda: defaultdict(dict))
    with ThreadPoolExecutor(4) as pool:  # the fields' queries at once
        futures = {
            f: pool.submit(reader.client.query_range, q(step), lo + step, hi + step, step) for f, q in queries.items()
        }
        answers: dict[str, list[PromSeries]] = {field: future.result() for field, future in futures.items()}
    for field, series in answers.items():
        for s in series:
            key = key_of(s.labels)
            if key is None:
                continue
            for t, v in s.samples:
                if math.isfinite(v):
                    points[key][field][t - step] = v
    out: dict[str, SeriesData] = {}
    for key, tables in sorted(points.items()):
        times = sorted({t for table in tables.values() for t in table})
        values = {field: tuple(tables.get(field, {}).get(t) for t in times) for field in queries}
        out[key] = SeriesData(key, "prometheus", step, tuple(times), values, values, values)
    return out


def nic_series(
    reader: PromReader, nic_ids: Sequence[str], fields: Sequence[str], start: float, end: float, max_points: int
) -> dict[str, SeriesData]:
    _check(fields, NIC_SERIES)
    wanted = {key for key in map(parse_nic_id, nic_ids) if key is not None}
    if not wanted:
        return {}
    matchers = f"node=~{regex_of(k[0] for k in wanted)}, device=~{regex_of(k[1] for k in wanted)}"
    queries = {
        field: _ranged(
            reader, NIC_FIELDS[field][0], NIC_FIELDS[field][1] == "rate" or field.endswith("_total"), matchers
        )
        for field in fields
    }

    def key_of(labels: Mapping[str, str]) -> str | None:
        key = _nic_key(labels)
        return nic_id(*key) if key in wanted and key is not None else None

    return _series(reader, queries, key_of, start, end, max_points)


def host_series(
    reader: PromReader, nodes: Sequence[str], fields: Sequence[str], start: float, end: float, max_points: int
) -> dict[str, SeriesData]:
    _check(fields, HOST_SERIES)
    if not nodes:
        return {}
    matchers = f"node=~{regex_of(nodes)}"
    queries = {field: _ranged(reader, HOST_FIELDS[field], False, matchers) for field in fields}
    return _series(reader, queries, lambda labels: labels.get("node") or None, start, end, max_points)


def job_host_series(
    reader: PromReader, job_id: str, fields: Sequence[str], start: float, end: float, max_points: int
) -> dict[str, SeriesData]:
    _check(fields, JOB_SERIES)
    matchers = f"job_id={quote(job_id)}"
    queries = {
        field: _ranged(reader, JOB_FIELDS[field][0], JOB_FIELDS[field][1] == "rate", matchers) for field in fields
    }
    return _series(reader, queries, lambda labels: labels.get("node") or None, start, end, max_points)
