"""Scenario files: the TOML that describes a simulated cluster, its jobs and its faults (docs/scenarios.md).

Every problem is a ``ConfigError`` naming the file, the dotted key (``jobs[1].gpus``) and the line.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, time
from pathlib import Path
from typing import Any, Final

from gpulens.config import ConfigError, TomlLocator, format_duration, parse_duration, parse_timestamp

from .models import CATALOGUE, GpuModel

JOB_KINDS: Final = ("training", "inference", "notebook", "idle")

# Each fault kind and the key that names its target.
FAULT_TARGETS: Final[Mapping[str, str]] = {
    "comm_stall": "job",
    "straggler": "gpu",
    "memory_leak": "gpu",
    "thermal_throttle": "gpu",
    "power_cap": "gpu",
    "pcie_degraded": "gpu",
    "nvlink_errors": "gpu",
    "xid": "gpu",
    "gpu_lost": "gpu",
    "idle_allocated": "job",
    "exporter_down": "node",
    "pcie_saturation": "gpu",
    "nvlink_saturation": "job",
    "dead_profiling": "node",
}
# Faults that only make sense while a job runs: their window must lie inside the job's, and without a
# ``duration`` they last until the job ends.
JOB_BOUND_FAULTS: Final = frozenset({"comm_stall", "idle_allocated", "nvlink_saturation", "straggler"})

DEFAULT_MEMORY_FRACTION: Final[Mapping[str, float]] = {
    "training": 0.85,
    "inference": 0.90,
    "notebook": 0.25,
    "idle": 0.0,
}
DEFAULT_GPU_MODEL: Final = "H100-SXM5-80GB"
DEFAULT_START: Final = "2026-01-01T00:00:00Z"
MIN_CHECKPOINT_STEPS: Final = 4
MAX_GPUS_PER_NODE: Final = 64

_NODE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_GPU_SPEC = re.compile(r"^(?P<node>[A-Za-z0-9._-]+)(?::(?P<sel>[0-9,\- ]+))?$")
_GPU_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")
_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column \d+\)")

_CLUSTER_KEYS: Final = frozenset({"nodes", "gpus_per_node", "gpu_model", "seed", "start", "duration", "step"})
_NODE_KEYS: Final = frozenset({"name", "gpu_model", "gpus_per_node"})
_JOB_KEYS: Final = frozenset(
    {"id", "user", "kind", "gpus", "start", "end", "memory_fraction", "checkpoint_every"},
)
_FAULT_KEYS: Final = frozenset({"kind", "job", "gpu", "node", "at", "duration", "xid"})
_TOP_KEYS: Final = frozenset({"cluster", "nodes", "jobs", "faults"})


@dataclass(frozen=True, slots=True, order=True)
class GpuRef:
    """One GPU of the cluster: a node name and an index on that node."""

    node: str
    index: int

    def __str__(self) -> str:
        return f"{self.node}:{self.index}"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    model: GpuModel
    gpus: int


@dataclass(frozen=True, slots=True, eq=False)
class JobSpec:
    """A job holding GPUs from ``start`` to ``end`` (epoch seconds)."""

    id: str
    user: str
    kind: str
    gpus: tuple[GpuRef, ...]
    start: float
    end: float
    memory_fraction: float
    checkpoint_every_s: float | None = None

    def running(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True, slots=True, eq=False)
class FaultSpec:
    """A fault from ``start`` to ``end`` (epoch seconds) on a job, a GPU or a node, as its kind requires.

    ``job`` is the job a job-scoped fault names, and for a ``straggler`` the training job it slows down.
    """

    index: int  # its position among the scenario's [[faults]]
    kind: str
    start: float
    end: float
    job: str | None = None
    gpu: GpuRef | None = None
    node: str | None = None
    xid: int | None = None

    def active(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True, slots=True)
class Scenario:
    """A parsed, validated scenario. Times are epoch seconds."""

    source: str
    start: float
    duration_s: float
    step_s: float
    seed: int
    nodes: tuple[NodeSpec, ...]
    jobs: tuple[JobSpec, ...] = ()
    faults: tuple[FaultSpec, ...] = ()

    @property
    def end(self) -> float:
        return self.start + self.duration_s


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file. Raises ``ConfigError`` naming the file, key and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read scenario: {getattr(exc, 'strerror', None) or exc}", file=path) from None
    return parse_scenario(text, source=str(path))


def parse_scenario(text: str, source: str = "<string>") -> Scenario:
    """Parse and validate scenario TOML text; ``source`` names it in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        m = _TOML_POSITION.search(message)
        line = int(m.group(1)) if m else None
        raise ConfigError(f"TOML syntax error: {_TOML_POSITION.sub('', message)}", file=source, line=line) from None
    return _ScenarioParser(data, source, TomlLocator(text)).parse()


# --------------------------------------------------------------------------------------------- reading tables


class _Table:
    """One TOML table being read: knows its dotted path and where its keys are, and checks their types."""

    def __init__(
        self, data: Mapping[str, Any], parser: _ScenarioParser, table: str | None, index: int | None = None
    ) -> None:
        self.data = data
        self._parser = parser
        self._table = table
        self._index = index

    @property
    def index(self) -> int:
        """The position of a ``[[...]]`` table in its array."""
        return self._index or 0

    def path(self, key: str) -> str:
        if self._table is None:
            return key
        if self._index is None:
            return f"{self._table}.{key}"
        return f"{self._table}[{self._index}].{key}"

    def fail(self, key: str, message: str) -> ConfigError:
        locator = self._parser.locator
        line = locator.line_of(self._table, self._index, key)
        if isinstance(self.data.get(key), dict):  # a sub-table: point at its [header] when it has one
            line = locator.line_of(key if self._table is None else f"{self._table}.{key}") or line
        return ConfigError(message, file=self._parser.source, key=self.path(key), line=line)

    def reject_unknown(self, allowed: frozenset[str]) -> None:
        for key in self.data:
            if key not in allowed:
                raise self.fail(key, f"unknown key (expected one of: {', '.join(sorted(allowed))})")

    def raw(self, key: str, required: bool = False) -> Any:
        if key not in self.data:
            if required:
                raise self.fail(key, "missing required key")
            return None
        return self.data[key]

    def text(self, key: str, default: str | None = None) -> str:
        value = self.raw(key, required=default is None)
        if value is None:
            assert default is not None
            return default
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"expected a non-empty string, got {value!r:.40}")
        return value.strip()

    def integer(self, key: str, default: int | None = None, minimum: int | None = None) -> int:
        value = self.raw(key, required=default is None)
        if value is None:
            assert default is not None
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {value!r:.40}")
        if minimum is not None and value < minimum:
            raise self.fail(key, f"must be at least {minimum}, got {value}")
        return value

    def fraction(self, key: str, default: float) -> float:
        value = self.raw(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
            raise self.fail(key, f"expected a number from 0 to 1, got {value!r:.40}")
        return float(value)

    def duration(self, key: str) -> float | None:
        """A positive duration (``"90s"``, ``"5m"``, a number of seconds), or ``None`` when absent."""
        value = self.raw(key)
        if value is None:
            return None
        try:
            seconds = parse_duration(value)
        except (TypeError, ValueError) as exc:
            raise self.fail(key, str(exc)) from None
        if seconds <= 0:
            raise self.fail(key, "must be longer than zero")
        return seconds

    def time(self, key: str, origin: float) -> float | None:
        """A time: an offset from ``origin`` (``"20m"``) or an RFC 3339 time; ``None`` when absent."""
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, datetime):
            return _datetime_seconds(value)
        if isinstance(value, date | time):
            raise self.fail(key, "expected an offset such as 20m or a full RFC 3339 time")
        try:
            return origin + parse_duration(value)
        except (TypeError, ValueError):
            pass
        if isinstance(value, str):
            try:
                return parse_timestamp(value)
            except ValueError:
                pass
        raise self.fail(key, f"not an offset (e.g. 20m) or an RFC 3339 time: {value!r:.40}")


def _datetime_seconds(value: datetime) -> float:
    return parse_timestamp(value.isoformat())


def _sub_tables(parser: _ScenarioParser, data: Mapping[str, Any], name: str, required: bool = False) -> list[_Table]:
    """The tables of ``[[name]]`` (an array of tables)."""
    top = _Table(data, parser, None)
    value = top.raw(name, required=required)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise top.fail(name, f"expected an array of tables ([[{name}]])")
    return [_Table(item, parser, name, i) for i, item in enumerate(value)]


# --------------------------------------------------------------------------------------------- the parser


class _ScenarioParser:
    def __init__(self, data: Mapping[str, Any], source: str, locator: TomlLocator) -> None:
        self.data = data
        self.source = source
        self.locator = locator
        self.nodes: dict[str, NodeSpec] = {}
        self.jobs: dict[str, JobSpec] = {}
        self.start = 0.0
        self.end = 0.0
        self.step = 0.0

    def parse(self) -> Scenario:
        _Table(self.data, self, None).reject_unknown(_TOP_KEYS)
        cluster = self._cluster_table()
        cluster.reject_unknown(_CLUSTER_KEYS)
        seed = cluster.integer("seed", default=0)
        self._read_times(cluster)
        self._read_nodes(cluster)
        jobs = [self._job(t) for t in _sub_tables(self, self.data, "jobs")]
        self._check_gpu_sharing(jobs)
        faults = [self._fault(t) for t in _sub_tables(self, self.data, "faults")]
        return Scenario(
            source=self.source,
            start=self.start,
            duration_s=self.end - self.start,
            step_s=self.step,
            seed=seed,
            nodes=tuple(self.nodes.values()),
            jobs=tuple(jobs),
            faults=tuple(faults),
        )

    def _cluster_table(self) -> _Table:
        top = _Table(self.data, self, None)
        value = top.raw("cluster")
        if value is None:
            raise ConfigError("missing the [cluster] table", file=self.source, key="cluster")
        if not isinstance(value, dict):
            raise top.fail("cluster", "expected a table ([cluster])")
        return _Table(value, self, "cluster")

    # ----------------------------------------------------------------------------------------- [cluster]

    def _read_times(self, cluster: _Table) -> None:
        raw_start = cluster.raw("start")
        if raw_start is not None and not isinstance(raw_start, str | datetime):
            raise cluster.fail("start", "expected an RFC 3339 time such as 2026-01-01T00:00:00Z")
        if _is_duration(raw_start):
            raise cluster.fail("start", "expected an RFC 3339 time, not an offset")
        start = cluster.time("start", origin=0.0)
        self.start = parse_timestamp(DEFAULT_START) if start is None else start
        duration = cluster.duration("duration")
        step = cluster.duration("step")
        self.end = self.start + (3600.0 if duration is None else duration)
        self.step = 10.0 if step is None else step
        if self.step > self.end - self.start:
            raise cluster.fail("step", "is longer than the scenario's duration")

    def _read_nodes(self, cluster: _Table) -> None:
        names = self._node_names(cluster)
        model = self._model(cluster, "gpu_model", DEFAULT_GPU_MODEL)
        gpus = self._gpu_count(cluster, 8)
        overrides = self._node_overrides(set(names))
        for name in names:
            table = overrides.get(name)
            if table is None:
                self.nodes[name] = NodeSpec(name, model, gpus)
            else:
                self.nodes[name] = NodeSpec(
                    name, self._model(table, "gpu_model", model.name), self._gpu_count(table, gpus)
                )

    def _node_overrides(self, names: set[str]) -> dict[str, _Table]:
        overrides: dict[str, _Table] = {}
        for table in _sub_tables(self, self.data, "nodes"):
            table.reject_unknown(_NODE_KEYS)
            name = table.text("name")
            if name not in names:
                raise table.fail("name", f"unknown node {name!r} (cluster.nodes defines {_listing(sorted(names))})")
            if name in overrides:
                raise table.fail("name", f"node {name!r} is overridden twice")
            overrides[name] = table
        return overrides

    @staticmethod
    def _gpu_count(table: _Table, default: int) -> int:
        count = table.integer("gpus_per_node", default, minimum=1)
        if count > MAX_GPUS_PER_NODE:
            raise table.fail("gpus_per_node", f"must be at most {MAX_GPUS_PER_NODE}")
        return count

    def _node_names(self, cluster: _Table) -> list[str]:
        value = cluster.raw("nodes", required=True)
        if isinstance(value, int) and not isinstance(value, bool):
            count = cluster.integer("nodes", minimum=1)
            width = max(2, len(str(count - 1)))
            return [f"node-{i:0{width}d}" for i in range(count)]
        if not isinstance(value, list) or not value:
            raise cluster.fail("nodes", "expected a node count or a non-empty list of node names")
        names: list[str] = []
        for name in value:
            if not isinstance(name, str) or not _NODE_NAME.match(name):
                raise cluster.fail("nodes", f"not a node name: {name!r:.40} (letters, digits, '.', '_', '-')")
            if name in names:
                raise cluster.fail("nodes", f"node {name!r} is listed twice")
            names.append(name)
        return names

    @staticmethod
    def _model(table: _Table, key: str, default: str) -> GpuModel:
        name = table.text(key, default)
        model = CATALOGUE.get(name)
        if model is None:
            raise table.fail(key, f"unknown GPU model {name!r} (the catalogue has {_listing(CATALOGUE)})")
        return model

    # ----------------------------------------------------------------------------------------- [[jobs]]

    def _job(self, table: _Table) -> JobSpec:
        table.reject_unknown(_JOB_KEYS)
        job_id = table.text("id")
        if job_id in self.jobs:
            raise table.fail("id", f"job {job_id!r} is defined twice")
        kind = self._choice(table, "kind", JOB_KINDS)
        start, end = self._job_window(table)
        job = JobSpec(
            id=job_id,
            user=table.text("user"),
            kind=kind,
            gpus=self._gpu_list(table),
            start=start,
            end=end,
            memory_fraction=table.fraction("memory_fraction", DEFAULT_MEMORY_FRACTION[kind]),
            checkpoint_every_s=self._checkpoint_every(table, kind),
        )
        self.jobs[job_id] = job
        return job

    def _job_window(self, table: _Table) -> tuple[float, float]:
        start = table.time("start", self.start)
        end = table.time("end", self.start)
        start = self.start if start is None else start
        end = self.end if end is None else end
        self._check_inside(table, "start", start)
        self._check_inside(table, "end", end, inclusive_end=True)
        if end <= start:
            raise table.fail("end", "must be after the job's start")
        return start, end

    def _checkpoint_every(self, table: _Table, kind: str) -> float | None:
        every = table.duration("checkpoint_every")
        if every is None:
            return None
        if kind != "training":
            raise table.fail("checkpoint_every", f"only training jobs checkpoint (this job is {kind})")
        if every < MIN_CHECKPOINT_STEPS * self.step:
            raise table.fail(
                "checkpoint_every", f"must be at least {MIN_CHECKPOINT_STEPS} steps ({format_duration(4 * self.step)})"
            )
        return every

    def _gpu_list(self, table: _Table) -> tuple[GpuRef, ...]:
        value = table.raw("gpus", required=True)
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
            raise table.fail("gpus", 'expected a list of GPU ranges such as ["node-00:0-7"]')
        gpus: dict[GpuRef, None] = {}
        for item in items:
            for ref in self._gpu_range(table, "gpus", item):
                if ref in gpus:
                    raise table.fail("gpus", f"GPU {ref} is listed twice")
                gpus[ref] = None
        return tuple(gpus)

    def _gpu_range(self, table: _Table, key: str, spec: str) -> list[GpuRef]:
        """``NODE`` (every GPU), ``NODE:I``, ``NODE:I-J`` or ``NODE:I,J,K-L``."""
        m = _GPU_SPEC.match(spec.strip())
        if not m:
            raise table.fail(key, f"not a GPU range: {spec!r:.40} (use NODE, NODE:I, NODE:I-J or NODE:I,J)")
        node = self._known_node(table, key, m.group("node"))
        if m.group("sel") is None:
            return [GpuRef(node.name, i) for i in range(node.gpus)]
        refs: list[GpuRef] = []
        for item in m.group("sel").split(","):
            im = _GPU_ITEM.match(item.strip())
            if not im:
                raise table.fail(key, f"not a GPU range: {spec!r:.40} (use NODE, NODE:I, NODE:I-J or NODE:I,J)")
            first = int(im.group(1))
            last = first if im.group(2) is None else int(im.group(2))
            if last < first:
                raise table.fail(key, f"GPU range {item.strip()!r} in {spec!r:.40} runs backwards")
            if last >= node.gpus:
                raise table.fail(key, f"{spec!r:.40}: {node.name} has GPUs 0-{node.gpus - 1}, not {last}")
            refs.extend(GpuRef(node.name, i) for i in range(first, last + 1))
        return refs

    def _known_node(self, table: _Table, key: str, name: str) -> NodeSpec:
        node = self.nodes.get(name)
        if node is None:
            raise table.fail(key, f"unknown node {name!r} (the cluster has {_listing(self.nodes)})")
        return node

    def _check_gpu_sharing(self, jobs: list[JobSpec]) -> None:
        """Only notebook jobs may share a GPU with each other at the same time."""
        holders: dict[GpuRef, list[tuple[int, JobSpec]]] = {}
        for i, job in enumerate(jobs):
            for ref in job.gpus:
                for _, other in holders.get(ref, []):
                    overlap = job.start < other.end and other.start < job.end
                    if overlap and not (job.kind == other.kind == "notebook"):
                        raise _Table({}, self, "jobs", i).fail(
                            "gpus",
                            f"GPU {ref} is held by job {other.id!r} ({other.kind}) at the same time; "
                            "only notebook jobs may share a GPU",
                        )
                holders.setdefault(ref, []).append((i, job))

    # ----------------------------------------------------------------------------------------- [[faults]]

    def _fault(self, table: _Table) -> FaultSpec:
        table.reject_unknown(_FAULT_KEYS)
        kind = self._choice(table, "kind", tuple(FAULT_TARGETS))
        target = FAULT_TARGETS[kind]
        for other in ("job", "gpu", "node"):
            if other != target and other in table.data:
                raise table.fail(other, f"a {kind} fault names a {target}, not a {other}")
        if kind != "xid" and "xid" in table.data:
            raise table.fail("xid", "only xid faults take an xid code")
        at = self._fault_at(table)
        job = self._fault_job(table) if target == "job" else None
        gpu = self._fault_gpu(table) if target == "gpu" else None
        node = self._known_node(table, "node", table.text("node")).name if target == "node" else None
        if gpu is not None and kind in JOB_BOUND_FAULTS:
            job = self._gpu_holder(table, kind, gpu, at)
        fault = FaultSpec(
            index=table.index,
            kind=kind,
            start=at,
            end=self._fault_end(table, kind, at, job),
            job=job.id if job else None,
            gpu=gpu,
            node=node,
            xid=table.integer("xid", minimum=1) if kind == "xid" else None,
        )
        if job is not None:
            self._check_job_fault(table, fault, job)
        if kind == "nvlink_errors" and gpu is not None and not self.nodes[gpu.node].model.has_nvlink:
            raise table.fail("gpu", f"{gpu} is a {self.nodes[gpu.node].model.name}: it has no NVLink")
        return fault

    def _fault_job(self, table: _Table) -> JobSpec:
        job_id = table.text("job")
        job = self.jobs.get(job_id)
        if job is None:
            raise table.fail("job", f"unknown job {job_id!r} (the scenario has {_listing(self.jobs)})")
        return job

    def _fault_gpu(self, table: _Table) -> GpuRef:
        spec = table.text("gpu")
        refs = self._gpu_range(table, "gpu", spec)
        if len(refs) != 1 or ":" not in spec:
            raise table.fail("gpu", f"expected one GPU such as node-01:3, got {spec!r:.40}")
        return refs[0]

    def _gpu_holder(self, table: _Table, kind: str, gpu: GpuRef, at: float) -> JobSpec:
        """The job a job-bound GPU fault (straggler) acts in: the one holding the GPU at ``at``."""
        for job in self.jobs.values():
            if job.running(at) and gpu in job.gpus:
                return job
        raise table.fail("gpu", f"a {kind} fault needs a job holding {gpu} at its start")

    def _fault_at(self, table: _Table) -> float:
        at = table.time("at", self.start)
        if at is None:
            raise table.fail("at", "missing required key")
        self._check_inside(table, "at", at)
        return at

    def _fault_end(self, table: _Table, kind: str, at: float, job: JobSpec | None) -> float:
        duration = table.duration("duration")
        if kind == "xid":
            if duration is not None:
                raise table.fail("duration", "an xid is a single event at `at`; it takes no duration")
            return self.end
        until = job.end if job is not None else self.end  # job-bound kinds last until the job ends
        end = until if duration is None else at + duration
        if end > self.end + 1e-9:
            raise table.fail("duration", "the fault runs past the end of the scenario")
        return end

    def _check_job_fault(self, table: _Table, fault: FaultSpec, job: JobSpec) -> None:
        kind = fault.kind
        key = FAULT_TARGETS[kind]
        if not (job.start <= fault.start and fault.end <= job.end + 1e-9):
            raise table.fail(
                "duration" if "duration" in table.data else "at", f"the fault must lie inside job {job.id!r}'s run"
            )
        if kind in ("comm_stall", "nvlink_saturation", "straggler") and (job.kind != "training" or len(job.gpus) < 2):
            raise table.fail(key, f"a {kind} fault needs a training job with 2 or more GPUs")
        if kind == "nvlink_saturation":
            per_node: dict[str, int] = {}
            for g in job.gpus:
                if self.nodes[g.node].model.has_nvlink:
                    per_node[g.node] = per_node.get(g.node, 0) + 1
            if max(per_node.values(), default=0) < 2:
                raise table.fail(key, "nvlink_saturation needs 2 or more of the job's GPUs on one NVLink node")

    # ----------------------------------------------------------------------------------------- helpers

    def _check_inside(self, table: _Table, key: str, t: float, inclusive_end: bool = False) -> None:
        past_end = t > self.end + 1e-9 if inclusive_end else t >= self.end
        if t < self.start or past_end:
            raise table.fail(key, "lies outside the scenario (cluster.start to cluster.start + cluster.duration)")

    @staticmethod
    def _choice(table: _Table, key: str, choices: tuple[str, ...]) -> str:
        value = table.text(key)
        if value not in choices:
            raise table.fail(key, f"unknown {key} {value!r} (expected one of: {', '.join(choices)})")
        return value


def _is_duration(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        parse_duration(value)
    except ValueError:
        return False
    return True


def _listing(names: Mapping[str, Any] | list[str], limit: int = 6) -> str:
    items = list(names)
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


__all__ = [
    "FAULT_TARGETS",
    "JOB_KINDS",
    "FaultSpec",
    "GpuRef",
    "JobSpec",
    "NodeSpec",
    "Scenario",
    "load_scenario",
    "parse_scenario",
]
