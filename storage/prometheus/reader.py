"""``PromReader``: the store read interface (``storage.reading.StoreReader``) over a Prometheus-compatible query API.

Query cost is bounded by what a page shows, never by the GPU count: ``latest_readings`` is up to four instant
queries (the gpulens families, their sample times, the dcgm-exporter families, theirs), ``series`` one range query
per field whatever the number of GPUs (mean, min and max of each step in one result), ``jobs`` aggregated by job in
Prometheus (``storage.prometheus.jobquery``). A call's independent queries are sent at once (``PARALLEL``), and only
for the families the store holds (its metric names, read at most every ``NAMES_TTL_S``). Ranges are
step-aligned (a panel refreshed a second later asks for the same points, which Thanos and Mimir cache), never finer
than ``[database] min_step`` (the scrape interval), gauges read with ``avg/min/max_over_time`` and counters with
``rate`` over the step, where the SQL path reads its rollups. A result over ``[database] max_series`` series is
refused with a message saying so.

What Prometheus does not hold is said, not faked: processes exist only where gpulens exporters export them
(``gpulens_process_gpu_memory_bytes``: by default one series per GPU and job, read as a process with pid 0 and no
command, the job's processes together; per process with the exporter's ``--process-pids``); over dcgm-exporter data
alone ``current_processes`` raises ``NotAvailableOnBackend``. First-seen times are not kept: a GPU's
``first_seen`` is its first sample in range.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Final

from gpulens.clock import Clock, SystemClock
from gpulens.fabricmodel import HostReading, JobHostReading, NicReading
from gpulens.model import GpuJob, GpuReading, JobInfo, ProcessReading, TargetHealth
from gpulens.ncclmodel import NcclView
from gpulens.nodehardware import NodeHardware
from gpulens.nodehealth import NodeHealth
from gpulens.settings import StoreAuth
from gpulens.storage.prometheus import (
    fabric,
    hardwareread,
    jobquery,
    jobread,
    ncclread,
    noderead,
    problems,
    recorded,
    targets,
)
from gpulens.storage.prometheus import families as fam
from gpulens.storage.prometheus.client import (
    LOOKBACK_S,
    PromClient,
    PromQueryError,
    PromSeries,
    quote,
    regex_escape,
    regex_of,
)
from gpulens.storage.prometheus.inspectorread import InspectorReads
from gpulens.storage.prometheus.unserved import BACKEND_NAME, Unserved
from gpulens.storage.prometheus.usageread import UsageReads
from gpulens.storage.reading import NotAvailableOnBackend
from gpulens.storage.records import (
    FIELD_KINDS,
    GpuInfo,
    JobSummary,
    LinkOutage,
    LinkSummary,
    NodeTotals,
    SeriesData,
    check_fields,
)

PARALLEL: Final = 4  # queries of one call in flight at once (Prometheus evaluates them on its cores)
NAMES_TTL_S: Final = 30.0  # how long the list of metric names the store holds is trusted, once it holds still
# ... and once it has changed: Prometheus lists a new target's names as it appends its first scrape, so a list read
# then can lack some of them (a dcgm-exporter's link and clock families, for 30 s: its jobs' traffic unread)
NAMES_CHANGED_TTL_S: Final = 5.0
NAMES_LOOKBACK_S: Final = 8 * 86400.0  # the names of the longest range a page shows, and a day
_AGGREGATES: Final = (("mean", "avg_over_time"), ("min", "min_over_time"), ("max", "max_over_time"))


def _tag(expr: str, value: str, label: str = "gl") -> str:
    return f'label_replace({expr}, {quote(label)}, {quote(value)}, "", "")'


class PromReader(UsageReads, Unserved, InspectorReads):
    """Reads gpulens and dcgm-exporter series from ``url`` (``prometheus+http(s)://host:port[/path]``)."""

    backend = "prometheus"

    def __init__(
        self,
        url: str,
        auth: StoreAuth | None = None,
        *,
        clock: Clock | None = None,
        environ: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        use_recorded: bool = True,
    ) -> None:
        self.client = PromClient(url, auth, timeout_s=timeout_s, environ=environ)
        self.url_redacted = self.client.url_redacted
        self.clock = clock or SystemClock()
        self.min_step_s = self.client.auth.min_step_s
        self._names: tuple[float, frozenset[str], float] | None = None  # (monotonic time read, metric names, TTL)
        # the recording rules' series (storage.prometheus.recorded) read where they cover a page's range
        self.use_recorded = use_recorded
        self.recording = recorded.Usage()

    def _present(self) -> frozenset[str] | None:
        """The metric names the store holds (read at most every ``NAMES_TTL_S``, or ``NAMES_CHANGED_TTL_S`` after
        they changed), so that no query asks for a family that is not there: over gpulens exporters alone no
        dcgm-exporter name is read, and the reverse. None (read every family) where the store does not answer the
        label values API."""
        now = self.clock.monotonic()
        if self._names is not None and now - self._names[0] < self._names[2]:
            return self._names[1]
        try:
            at = self.clock.now()
            names = frozenset(self.client.metric_names(at - NAMES_LOOKBACK_S, at + LOOKBACK_S))
        except PromQueryError:
            return None
        if fam.UP in names or names & set(fam.DCGM_PRESENCE):  # GPUs there: keep it (until then, read again)
            settled = self._names is not None and self._names[1] == names
            self._names = (now, names, NAMES_TTL_S if settled else NAMES_CHANGED_TTL_S)
        return names

    def present_names(self) -> frozenset[str] | None:
        """The metric names the store holds (None where it does not say): see ``_present``."""
        return self._present()

    def _exists(self, name: str) -> bool:
        present = self._present()
        return present is None or name in present

    def _sources(self, field: str) -> list[fam.Source]:
        return [s for s in fam.sources(field) if self._exists(s.name)]

    def scrub(self, text: str) -> str:
        return self.client.scrub(text)

    @contextmanager
    def snapshot(self) -> Iterator[PromReader]:
        yield self  # each query reads its own moment: Prometheus has no transaction to hold

    def close(self) -> None:
        self.client.close()

    # --- the cluster now ---------------------------------------------------------------------------------------

    @staticmethod
    def _matchers(node: str | None, uuids: Sequence[str] | None, *, dcgm: bool) -> str:
        parts = []
        if node is not None:
            parts.append(("Hostname" if dcgm else "node") + "=" + quote(node))
        if uuids is not None:
            parts.append(("UUID" if dcgm else "uuid") + "=~" + regex_of(uuids))
        return ", ".join(parts)

    def latest_readings(
        self,
        *,
        node: str | None = None,
        uuids: Sequence[str] | None = None,
        max_age_s: float | None = None,
        fields: Sequence[str] | None = None,
    ) -> list[GpuReading]:
        if uuids is not None and not uuids:
            return []
        now = self.clock.now()
        own = self._matchers(node, uuids, dcgm=False)
        # A read of the whole cluster goes one family per query, the queries at once: no one answer nears max_series
        # (about 50 series per GPU in all), and Prometheus encodes one answer while gpulens decodes another (at 8,000
        # GPUs the overview's read takes 1.0 s so, 1.7 s as one query). A node's or GPUs' read is one query.
        whole = node is None and uuids is None
        dcgm_matchers = self._dcgm_matchers(node, uuids)
        names = [n for n in fam.dcgm_names(fields) if self._exists(n)]
        # timestamp() of each name's selector (MetricsQL evaluates timestamp() of anything but a selector as a
        # subquery: no sample times), tagged with the name (timestamp() drops it: two names of one GPU would collide)
        named = " or ".join(
            _tag(f"timestamp({fam.selector((n,), m)})", n, "gl_name")
            for n in fam.DCGM_PRESENCE
            if self._exists(n)
            for m in dcgm_matchers
        )
        # the series and their sample times of both sources, at once
        series, times, dcgm_series, dcgm_times = self._parallel(
            lambda: self._instant(fam.reading_families(fields), own, now, chunk=1 if whole else 0),
            lambda: self.sample_times(f"timestamp({fam.UP}{{{own}}})", "uuid", now),
            lambda: self._instant(names, dcgm_matchers, now, chunk=8 if whole else 0) if names else [],
            lambda: self.sample_times(f"max by (UUID) ({named})", "UUID", now) if names and named else {},
        )
        readings = fam.gpulens_readings(series, times, now)
        seen = {r.uuid for r in readings}
        dcgm_series = [s for s in dcgm_series if node is None or fam.dcgm_node(s.labels) == node]
        if dcgm_series:
            readings += fam.dcgm_readings(dcgm_series, dcgm_times, now, skip=seen)[0]
        if max_age_s is not None:
            readings = [r for r in readings if r.timestamp >= now - max_age_s]
        return sorted(readings, key=lambda r: (r.node, r.gpu))

    def _dcgm_matchers(self, node: str | None, uuids: Sequence[str] | None) -> list[str]:
        """Matcher sets selecting dcgm-exporter series of ``node`` / ``uuids``: a node is named by ``hostname``
        (4.6+), ``Hostname`` (earlier) or, with neither, the scrape's ``instance`` host (alternatives, or'd)."""
        base = self._matchers(None, uuids, dcgm=True)
        if node is None:
            return [base]
        named = [f"Hostname={quote(node)}", f"hostname={quote(node)}"]
        host = 'Hostname="", hostname="", instance=~' + quote(regex_escape(node) + "(:[0-9]+)?")
        return [", ".join(m for m in (base, alternative) if m) for alternative in (*named, host)]

    def _instant(self, names: Sequence[str], matchers: str | list[str], now: float, *, chunk: int) -> list[PromSeries]:
        """The series of ``names`` now (``matchers``: one set, or alternatives or'd), ``chunk`` names a query."""
        alternatives = [matchers] if isinstance(matchers, str) else matchers
        groups = [names] if chunk <= 0 else [names[i : i + chunk] for i in range(0, len(names), chunk)]
        if len(groups) == 1:
            return self.client.query(" or ".join(fam.selector(groups[0], m) for m in alternatives), now)
        with ThreadPoolExecutor(PARALLEL) as pool:
            answers = pool.map(
                lambda group: self.client.query(" or ".join(fam.selector(group, m) for m in alternatives), now), groups
            )
            return [s for answer in answers for s in answer]

    @staticmethod
    def _parallel(*calls: Callable[[], Any]) -> list[Any]:
        """The calls' results, in order, the calls made at once (each query waits on Prometheus)."""
        with ThreadPoolExecutor(PARALLEL) as pool:
            futures = [pool.submit(call) for call in calls]
            return [future.result() for future in futures]

    parallel = _parallel

    def sample_times(self, promql: str, label: str, now: float) -> dict[str, float]:
        """``label`` -> value of each series of ``promql`` (sample times: ``timestamp(...)``)."""
        return {s.labels[label]: s.value for s in self.client.query(promql, now) if s.labels.get(label)}

    def node_totals(self) -> list[NodeTotals] | None:
        return recorded.node_totals(self, self.clock.now()) if self.use_recorded else None

    def link_summary(self, top: int) -> LinkSummary | None:
        return recorded.link_summary(self, self.clock.now(), top) if self.use_recorded else None

    def current_jobs(self, *, node: str | None = None) -> list[GpuJob]:
        now = self.clock.now()
        dcgm = any(self._exists(n) for n in fam.DCGM_PRESENCE)
        held, grouped, up = self._parallel(
            lambda: self.client.query(fam.JOB_INFO, now),
            lambda: self.client.query(self._dcgm_job_query(), now) if dcgm else [],
            lambda: self.client.query(f"group by (uuid) ({fam.UP})", now) if dcgm else [],
        )
        jobs = [
            GpuJob(
                s.labels.get("node", ""),
                int(s.labels["gpu"]),
                s.labels["uuid"],
                s.labels["job_id"],
                s.labels.get("user") or None,
            )
            for s in held
            if s.labels.get("uuid") and s.labels.get("job_id") and s.labels.get("gpu", "").isdigit()
        ]
        covered = {s.labels["uuid"] for s in up if s.labels.get("uuid")}
        jobs += fam.dcgm_jobs(grouped, skip=covered)
        return sorted((j for j in jobs if node is None or j.node == node), key=lambda j: (j.node, j.gpu, j.job_id))

    @staticmethod
    def _dcgm_job_query() -> str:
        by = "UUID, gpu, Hostname, hostname, instance, pod, namespace, hpc_job"
        held = [fam.selector(fam.DCGM_PRESENCE, f'{k}!=""') for k in ("pod", "hpc_job")]
        return f"group by ({by}) ({held[0]} or {held[1]})"

    def current_processes(self, *, node: str | None = None) -> list[ProcessReading]:
        now = self.clock.now()
        series = self.client.query(f"{fam.PROCESS} or count({fam.UP})", now)
        rows = [s for s in series if s.labels.get("__name__") == fam.PROCESS]
        if not rows and not any(s.value for s in series if not s.labels):
            raise NotAvailableOnBackend("GPU processes", BACKEND_NAME, "it holds no gpulens exporter series")
        out = [
            ProcessReading(
                node=s.labels.get("node", ""),
                gpu=int(s.labels.get("gpu", "0")),
                uuid=s.labels.get("uuid", ""),
                pid=int(s.labels.get("pid", "0")),
                memory_used_bytes=round(s.value),
                command=s.labels.get("command") or None,
                user=s.labels.get("user") or None,
                job_id=s.labels.get("job_id") or None,
            )
            for s in rows
            if s.labels.get("pid", "0").isdigit() and (node is None or s.labels.get("node", "") == node)
        ]
        return sorted(out, key=lambda p: (p.node, p.gpu, p.pid))

    # --- over time ---------------------------------------------------------------------------------------------

    def _step(self, start: float, end: float, max_points: int) -> tuple[float, float, float]:
        """A step of whole seconds, at least ``min_step``, and the range aligned to it."""
        step = max(self.min_step_s, math.ceil((end - start) / max(1, max_points - 1)))
        return math.floor(start / step) * step, math.ceil(end / step) * step, float(step)

    def field_query(
        self, field: str, matchers: Mapping[bool, str], step: float, aggregates: Sequence[str] = ("mean", "min", "max")
    ) -> str:
        """One PromQL expression giving every source's mean, min and max (gauges; only ``aggregates``) or rate
        (counters) per step, each series tagged ``gl="<aggregate>:<source index>"``."""
        check_fields([field])
        kind = FIELD_KINDS[field]
        window = f"[{step:g}s]"
        counter_window = f"[{max(step, 4 * self.min_step_s):g}s]"
        parts = []
        for i, source in enumerate(self._sources(field)):
            selected = source.selector(matchers[source.dcgm])
            if source.name == fam.XIDS:
                parts.append(_tag(f"sum without (xid) (rate({selected}{counter_window}))", f"rate:{i}"))
            elif kind == "counter":
                parts.append(_tag(f"rate({selected}{counter_window})", f"rate:{i}"))
            elif kind == "bitmask":
                parts.append(_tag(f"max_over_time({selected}{window})", f"max:{i}"))
            else:
                parts += [_tag(f"{fn}({selected}{window})", f"{a}:{i}") for a, fn in _AGGREGATES if a in aggregates]
        return " or ".join(parts)

    def series(
        self,
        uuids: Sequence[str] | None,
        fields: Sequence[str],
        start: float,
        end: float,
        max_points: int = 1000,
        *,
        aggregates: Mapping[str, Sequence[str]] | None = None,
    ) -> dict[str, SeriesData]:
        """Time series per GPU (all GPUs when ``uuids`` is None); buckets are ``step`` wide, stamped at their start.

        ``aggregates``: per gauge field, the aggregates wanted of mean, min and max (all by default); one left out
        reads as the mean."""
        if max_points < 2:
            raise ValueError("max_points must be at least 2")
        if end < start:
            raise ValueError("end is before start")
        check_fields(fields)
        if uuids is not None and not uuids:
            return {}
        lo, hi, step = self._step(start, end, max_points)
        matchers = {
            False: "" if uuids is None else f"uuid=~{regex_of(uuids)}",
            True: "" if uuids is None else f"UUID=~{regex_of(uuids)}",
        }
        # per GPU, "field/aggregate" -> bucket start -> value
        points: dict[str, dict[str, dict[float, float]]] = defaultdict(dict)
        # nothing in Prometheus holds a field without sources: no values, not zeros
        held = [f for f in fields if self._sources(f)]
        promql = [self.field_query(f, matchers, step, (aggregates or {}).get(f, ("mean", "min", "max"))) for f in held]
        with ThreadPoolExecutor(PARALLEL) as pool:  # one query per field, all at once
            answers = list(pool.map(lambda q: self.client.query_range(q, lo + step, hi + step, step), promql))
        for field, answer in zip(held, answers, strict=True):
            sources = self._sources(field)
            chosen: dict[tuple[str, str], int] = {}  # (uuid, aggregate) -> rank of the source read
            for s in answer:
                uuid = fam.uuid_of(s.labels)
                agg, _, index = s.labels.get("gl", "").partition(":")
                if uuid is None or not index.isdigit():
                    continue
                source = sources[int(index)]
                rank = (0 if source.dcgm else 10) + source.rank  # gpulens families first, then 4.6+ names
                if chosen.get((uuid, agg), -1) > rank:
                    continue
                key = f"{field}/{agg}"
                if chosen.get((uuid, agg)) != rank:
                    points[uuid][key] = {}
                chosen[(uuid, agg)] = rank
                _fill(points[uuid][key], s, source, step)
        out: dict[str, SeriesData] = {}
        for uuid, tables in points.items():
            times = sorted({t for table in tables.values() for t in table})
            values: dict[str, tuple[float | None, ...]] = {}
            minimum: dict[str, tuple[float | None, ...]] = {}
            maximum: dict[str, tuple[float | None, ...]] = {}
            for field in fields:
                kind = FIELD_KINDS[field]
                main = tables.get(
                    f"{field}/{'rate' if kind == 'counter' else 'max' if kind == 'bitmask' else 'mean'}", {}
                )
                values[field] = tuple(main.get(t) for t in times)
                low, high = tables.get(f"{field}/min"), tables.get(f"{field}/max")
                minimum[field] = values[field] if low is None else tuple(low.get(t) for t in times)
                maximum[field] = (
                    values[field] if high is None or kind == "bitmask" else tuple(high.get(t) for t in times)
                )
            out[uuid] = SeriesData(uuid, "prometheus", step, tuple(times), values, minimum, maximum)
        return out

    def jobs(self, start: float, end: float, *, job_id: str | None = None) -> list[JobSummary]:
        """Aggregated by job in Prometheus, from the recorded series where they cover the range
        (``storage.prometheus.jobread``)."""
        return jobread.jobs(self, start, end, job_id)

    def job_info(self, job_ids: Sequence[str]) -> dict[str, JobInfo]:
        """What the scheduler says of each job (``gpulens_job_info``), as last exported within ``NAMES_LOOKBACK_S``."""
        if not job_ids or not self._exists(fam.SCHEDULER_INFO):
            return {}
        promql = jobquery.scheduler_info_query(job_ids, NAMES_LOOKBACK_S)
        return jobquery.scheduler_info(self.client.query(promql, self.clock.now()))

    def gpu_info(self, *, uuids: Sequence[str] | None = None) -> list[GpuInfo]:
        return [
            GpuInfo(
                r.node, r.gpu, r.uuid, r.model, r.pci_bus_id, r.driver_version, r.mig_enabled, r.timestamp, r.timestamp
            )
            for r in self.latest_readings(uuids=uuids)
        ]

    def link_outages(self, start: float, end: float) -> list[LinkOutage]:
        lo, hi, step = self._step(start, end, 500)
        selected = fam.LINK_ACTIVE
        if self._exists(fam.LINKS_ACTIVE):
            # Only the GPUs whose count of active links changed in the range, or is below their model's most at its
            # end (a link down all along), are read link by link: one series per GPU instead of one per link (18 on
            # an H100).
            gpus = recorded.unsteady_links(self, lo, hi) if self.use_recorded else None
            if gpus is None:
                window, count = f"[{round(hi - lo)}s]", fam.LINKS_ACTIVE
                # changes(): one pass over the samples, where min < max took two and a join (the whole query at 8,000
                # GPUs: 123 against 180 CPU-ms, 2026-12-07)
                changed = f"changes({count}{window}) > 0"
                query = f"{changed} or {fam.fewer_links_active(count)}"
                gpus = {s.labels["uuid"] for s in self.client.query(query, hi) if s.labels.get("uuid")}
            if not gpus:
                return []
            selected = f"{fam.LINK_ACTIVE}{{uuid=~{regex_of(gpus)}}}"
        out = []
        for s in self.client.query_range(f"{selected} == 0", lo, hi, step):
            labels = s.labels
            if not labels.get("uuid") or not labels.get("link", "").isdigit():
                continue
            runs: list[list[float]] = []
            for t, _ in s.samples:
                if runs and t - runs[-1][1] <= step * 1.5:
                    runs[-1][1] = t
                else:
                    runs.append([t, t])
            for since, until in runs:
                ongoing = until >= hi - step
                gpu = int(labels.get("gpu", "0"))
                out.append(
                    LinkOutage(
                        labels.get("node", ""),
                        gpu,
                        labels["uuid"],
                        int(labels["link"]),
                        since,
                        None if ongoing else until,
                        None,
                    )
                )
        return sorted(out, key=lambda o: (o.node, o.gpu, o.link, o.since))

    def target_health(self) -> list[TargetHealth]:
        return targets.target_health(self.client, self.clock.now())

    # --- the fabric and the host (storage.prometheus.fabric) -----------------------------------------------------

    def latest_nics(
        self,
        *,
        node: str | None = None,
        max_age_s: float | None = None,
        fields: Sequence[str] | None = None,
        nodes: Sequence[str] | None = None,
        newest_rates: bool = False,
    ) -> list[NicReading]:
        return fabric.latest_nics(
            self, node=node, max_age_s=max_age_s, fields=fields, nodes=nodes, newest_rates=newest_rates
        )

    def history_start(self) -> float | None:
        return None  # Prometheus bounds a range query by its own retention and step

    def nic_counts(self) -> dict[str, tuple[int, int]]:
        return fabric.nic_counts(self)

    def nic_problems(self, start: float, end: float) -> dict[str, tuple[str, ...]]:
        found = recorded.nic_problems(self, start, end) if self.use_recorded else None
        return problems.nic_problems(self, start, end) if found is None else found

    def latest_hosts(self, *, node: str | None = None) -> list[HostReading]:
        return fabric.latest_hosts(self, node=node)

    def latest_hardware(self, nodes: Sequence[str] | None = None) -> dict[str, tuple[NodeHardware, str | None]]:
        return hardwareread.latest_hardware(self, nodes)

    def latest_job_hosts(self, *, job_id: str | None = None) -> list[JobHostReading]:
        return fabric.latest_job_hosts(self, job_id=job_id)

    def latest_nccl(self, *, max_age_s: float) -> dict[str, NcclView]:
        return ncclread.latest_nccl(self, max_age_s=max_age_s)

    def hung_nodes(self, *, max_age_s: float) -> dict[str, float]:
        return noderead.hung_nodes(self, max_age_s=max_age_s)

    def node_health(self, nodes: Sequence[str] | None = None) -> dict[str, NodeHealth]:
        return noderead.node_health(self, nodes)

    def nic_series(
        self, nic_ids: Sequence[str], fields: Sequence[str], start: float, end: float, max_points: int = 1000
    ) -> dict[str, SeriesData]:
        return fabric.nic_series(self, nic_ids, fields, start, end, max_points)

    def host_series(
        self, nodes: Sequence[str], fields: Sequence[str], start: float, end: float, max_points: int = 1000
    ) -> dict[str, SeriesData]:
        return fabric.host_series(self, nodes, fields, start, end, max_points)

    def job_host_series(
        self, job_id: str, fields: Sequence[str], start: float, end: float, max_points: int = 1000
    ) -> dict[str, SeriesData]:
        return fabric.job_host_series(self, job_id, fields, start, end, max_points)


def _fill(table: dict[float, float], s: PromSeries, source: fam.Source, step: float) -> None:
    """Add one series' samples to ``table`` (bucket start -> value) in gpulens units; throttle reasons OR'd in."""
    bit = fam.THROTTLE_BITS.get(s.labels.get("reason", "")) if source.name == fam.THROTTLE else None
    for t, v in s.samples:
        if not math.isfinite(v):
            continue
        if bit is not None:
            table[t - step] = float(int(table.get(t - step, 0)) | (bit if v else 0))
        elif source.name != fam.THROTTLE:
            table[t - step] = v * source.factor
