"""Scenario files: read the TOML that describes a simulated cluster, its jobs and its faults (docs/scenarios.md).

The text is converted to the typed structs of ``gpulens.exporter.sim.scenario_input`` by ``gpulens.typedinput`` (unknown
keys, missing keys and wrong types), then resolved here into a :class:`~gpulens.exporter.sim.specs.Scenario`: times and
durations to seconds, GPU ranges to GPUs, fault targets to nodes, jobs and GPUs, each fault checked by its kind.
Every problem is a ``ConfigError`` naming the file, the dotted key (``jobs[1].gpus``) and the line.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from gpulens.config import ConfigError, TomlLocator, format_duration, parse_duration, parse_timestamp
from gpulens.exporter.sim.faults import FAULT_KINDS, FAULT_TARGETS, FaultCheckError, FaultKind, ScenarioView
from gpulens.exporter.sim.faults.kind import REACHES_PORT_USERS, FaultParams
from gpulens.exporter.sim.gpuranges import GpuRanges, listing
from gpulens.exporter.sim.models import CATALOGUE, GpuModel
from gpulens.exporter.sim.nics import LINK_LAYERS, NicLayout, default_layout, node_nics
from gpulens.exporter.sim.scenario_input import ClusterInput, JobInput, ScenarioInput, read_input
from gpulens.exporter.sim.specs import FaultSpec, GpuRef, JobSpec, NodeSpec, Scenario
from gpulens.typedinput import read_text

JOB_KINDS: Final = ("training", "inference", "notebook", "idle")
DEFAULT_MEMORY_FRACTION: Final[Mapping[str, float]] = {
    "training": 0.85,
    "inference": 0.90,
    "notebook": 0.25,
    "idle": 0.0,
}
DEFAULT_GPU_MODEL: Final = "H100-SXM5-80GB"
DEFAULT_GPUS_PER_NODE: Final = 8
DEFAULT_START: Final = "2026-01-01T00:00:00Z"
DEFAULT_DURATION_S: Final = 3600.0
DEFAULT_STEP_S: Final = 10.0
MIN_CHECKPOINT_STEPS: Final = 4
MAX_CHECKPOINT_DURATION_S: Final = 900.0  # checkpoints of up to 15 minutes: a healthy job's longest quiet phase
DEFAULT_EVAL_DURATION_S: Final = 120.0

_NODE_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file. Raises ``ConfigError`` naming the file, key and line."""
    return parse_scenario(read_text(path), source=str(path))


def parse_scenario(text: str, source: str = "<string>") -> Scenario:
    """Parse and validate scenario TOML text; ``source`` names it in errors."""
    return _Resolver(read_input(text, source), source, TomlLocator(text)).scenario()


class _Resolver:
    """Turns the typed scenario into a :class:`Scenario`, checking what needs the rest of the file."""

    def __init__(self, typed: ScenarioInput, source: str, locator: TomlLocator) -> None:
        self.typed = typed
        self.source = source
        self.locator = locator
        self.nodes: dict[str, NodeSpec] = {}
        self.jobs: dict[str, JobSpec] = {}
        self.ranges = GpuRanges(self.nodes, self.fail)
        self.start = 0.0
        self.end = 0.0
        self.step = 0.0

    def fail(self, table: str, index: int | None, key: str, message: str) -> ConfigError:
        where = table if index is None else f"{table}[{index}]"
        line = self.locator.line_of(table, index, key)
        return ConfigError(message, file=self.source, key=f"{where}.{key}", line=line)

    def scenario(self) -> Scenario:
        cluster = self.typed.cluster
        self._read_times(cluster)
        self._read_nodes(cluster)
        jobs = [self._job(i, job) for i, job in enumerate(self.typed.jobs)]
        self._check_gpu_sharing(jobs)
        faults = [self._fault(i, params) for i, params in enumerate(self.typed.faults)]
        return Scenario(
            source=self.source,
            start=self.start,
            duration_s=self.end - self.start,
            step_s=self.step,
            seed=cluster.seed,
            nodes=tuple(self.nodes.values()),
            jobs=tuple(jobs),
            faults=tuple(faults),
        )

    # ----------------------------------------------------------------------------------------- values

    def duration(self, table: str, index: int | None, key: str, value: str | float | None) -> float | None:
        """A positive duration (``"90s"``, ``"5m"``, a number of seconds), or ``None`` when absent."""
        if value is None:
            return None
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise self.fail(table, index, key, str(exc)) from None
        if seconds <= 0:
            raise self.fail(table, index, key, "must be longer than zero")
        return seconds

    def time(self, table: str, index: int | None, key: str, value: str | float | None) -> float | None:
        """A time: an offset from the scenario's start (``"20m"``) or an RFC 3339 time; ``None`` when absent."""
        if value is None:
            return None
        try:
            return self.start + parse_duration(value)
        except ValueError:
            pass
        if isinstance(value, str):
            try:
                return parse_timestamp(value)
            except ValueError:
                pass
        raise self.fail(table, index, key, f"not an offset (e.g. 20m) or an RFC 3339 time: {value!r:.40}")

    def inside(self, table: str, index: int | None, key: str, t: float, inclusive_end: bool = False) -> None:
        past_end = t > self.end + 1e-9 if inclusive_end else t >= self.end
        if t < self.start or past_end:
            raise self.fail(
                table, index, key, "lies outside the scenario (cluster.start to cluster.start + cluster.duration)"
            )

    def text(self, table: str, index: int | None, key: str, value: str) -> str:
        if not value.strip():
            raise self.fail(table, index, key, "expected a non-empty string, got ''")
        return value.strip()

    # ----------------------------------------------------------------------------------------- [cluster]

    def _read_times(self, cluster: ClusterInput) -> None:
        start = cluster.start
        if start is not None and _is_duration(start):
            raise self.fail("cluster", None, "start", "expected an RFC 3339 time, not an offset")
        try:
            self.start = parse_timestamp(DEFAULT_START if start is None else start)
        except ValueError:
            raise self.fail(
                "cluster", None, "start", f"not an offset (e.g. 20m) or an RFC 3339 time: {start!r:.40}"
            ) from None
        duration = self.duration("cluster", None, "duration", cluster.duration)
        step = self.duration("cluster", None, "step", cluster.step)
        self.end = self.start + (DEFAULT_DURATION_S if duration is None else duration)
        self.step = DEFAULT_STEP_S if step is None else step
        if self.step > self.end - self.start:
            raise self.fail("cluster", None, "step", "is longer than the scenario's duration")

    def _read_nodes(self, cluster: ClusterInput) -> None:
        names = self._node_names(cluster)
        model = self._model("cluster", None, cluster.gpu_model or DEFAULT_GPU_MODEL)
        gpus = cluster.gpus_per_node or DEFAULT_GPUS_PER_NODE
        overrides: dict[str, NodeSpec] = {}
        for i, node in enumerate(self.typed.nodes):
            name = self.text("nodes", i, "name", node.name)
            if name not in names:
                raise self.fail("nodes", i, "name", f"unknown node {name!r} (cluster.nodes defines {listing(names)})")
            if name in overrides:
                raise self.fail("nodes", i, "name", f"node {name!r} is overridden twice")
            node_model = model if node.gpu_model is None else self._model("nodes", i, node.gpu_model)
            node_gpus = node.gpus_per_node or gpus
            overrides[name] = NodeSpec(name, node_model, node_gpus, node_nics(node_gpus, self._layout(i, node_model)))
        plain = node_nics(gpus, default_layout(model.name))
        for name in names:
            self.nodes[name] = overrides.get(name) or NodeSpec(name, model, gpus, plain)

    def _layout(self, i: int, model: GpuModel) -> NicLayout:
        """A ``[[nodes]]`` table's RDMA ports: the model's defaults with its ``nics``, ``nic_rate_gbps`` and
        ``nic_link_layer`` overrides."""
        node = self.typed.nodes[i]
        layout = default_layout(model.name)
        layer = layout.link_layer
        if node.nic_link_layer is not None:
            layer = node.nic_link_layer.strip()
            if layer not in LINK_LAYERS:
                raise self.fail(
                    "nodes",
                    i,
                    "nic_link_layer",
                    f"unknown link layer {layer!r:.40} (expected one of: InfiniBand, Ethernet)",
                )
        return NicLayout(
            node.nics or layout.count,
            layout.rate_gbps if node.nic_rate_gbps is None else float(node.nic_rate_gbps),
            layer,
        )

    def _node_names(self, cluster: ClusterInput) -> list[str]:
        if isinstance(cluster.nodes, int):
            count = cluster.nodes
            width = max(2, len(str(count - 1)))
            return [f"node-{i:0{width}d}" for i in range(count)]
        if not cluster.nodes:
            raise self.fail("cluster", None, "nodes", "expected a node count or a non-empty list of node names")
        names: list[str] = []
        for name in cluster.nodes:
            if not _NODE_NAME.match(name):
                raise self.fail(
                    "cluster", None, "nodes", f"not a node name: {name!r:.40} (letters, digits, '.', '_', '-')"
                )
            if name in names:
                raise self.fail("cluster", None, "nodes", f"node {name!r} is listed twice")
            names.append(name)
        return names

    def _model(self, table: str, index: int | None, name: str) -> GpuModel:
        name = self.text(table, index, "gpu_model", name)
        model = CATALOGUE.get(name)
        if model is None:
            raise self.fail(
                table, index, "gpu_model", f"unknown GPU model {name!r} (the catalogue has {listing(CATALOGUE)})"
            )
        return model

    # ----------------------------------------------------------------------------------------- [[jobs]]

    def _job(self, i: int, job: JobInput) -> JobSpec:
        job_id = self.text("jobs", i, "id", job.id)
        if job_id in self.jobs:
            raise self.fail("jobs", i, "id", f"job {job_id!r} is defined twice")
        kind = job.kind.strip()
        if kind not in JOB_KINDS:
            raise self.fail("jobs", i, "kind", f"unknown kind {kind!r} (expected one of: {', '.join(JOB_KINDS)})")
        start = self.time("jobs", i, "start", job.start)
        end = self.time("jobs", i, "end", job.end)
        start = self.start if start is None else start
        end = self.end if end is None else end
        self.inside("jobs", i, "start", start)
        self.inside("jobs", i, "end", end, inclusive_end=True)
        if end <= start:
            raise self.fail("jobs", i, "end", "must be after the job's start")
        fraction = DEFAULT_MEMORY_FRACTION[kind] if job.memory_fraction is None else job.memory_fraction
        if not 0.0 <= fraction <= 1.0:
            raise self.fail("jobs", i, "memory_fraction", f"expected a number from 0 to 1, got {fraction!r:.40}")
        spec = JobSpec(
            id=job_id,
            user=self.text("jobs", i, "user", job.user),
            kind=kind,
            gpus=self.ranges.gpu_list("jobs", i, "gpus", job.gpus),
            start=start,
            end=end,
            memory_fraction=float(fraction),
            checkpoint_every_s=self._checkpoint_every(i, job, kind),
            checkpoint_ranks=self._checkpoint_ranks(i, job),
            checkpoint_stuck_s=self._checkpoint_stuck(i, job),
            **self._phases(i, job, kind, end - start),
            nccl_ras=job.nccl_ras,
            nccl_version=self._nccl_version(i, job.nccl_version),
            nccl_inspector=job.nccl_inspector,
        )
        self.jobs[job_id] = spec
        return spec

    def _nccl_version(self, i: int, version: str) -> str:
        parts = version.split(".")
        if len(parts) != 3 or not all(p.isdigit() for p in parts) or (int(parts[0]), int(parts[1])) < (2, 24):
            raise self.fail("jobs", i, "nccl_version", "expected an NCCL version 2.24.0 or later, e.g. 2.28.7")
        return version

    def _checkpoint_every(self, i: int, job: JobInput, kind: str) -> float | None:
        every = self.duration("jobs", i, "checkpoint_every", job.checkpoint_every)
        if every is None:
            return None
        if kind != "training":
            raise self.fail("jobs", i, "checkpoint_every", f"only training jobs checkpoint (this job is {kind})")
        if every < MIN_CHECKPOINT_STEPS * self.step:
            least = format_duration(MIN_CHECKPOINT_STEPS * self.step)
            raise self.fail("jobs", i, "checkpoint_every", f"must be at least {MIN_CHECKPOINT_STEPS} steps ({least})")
        return every

    def _checkpoint_ranks(self, i: int, job: JobInput) -> tuple[GpuRef, ...]:
        if job.checkpoint_ranks is None:
            return ()
        if job.checkpoint_every is None:
            raise self.fail("jobs", i, "checkpoint_ranks", "needs checkpoint_every")
        writers = self.ranges.gpu_list("jobs", i, "checkpoint_ranks", job.checkpoint_ranks)
        gpus = self.ranges.gpu_list("jobs", i, "gpus", job.gpus)
        if not set(writers) <= set(gpus) or set(writers) == set(gpus):
            raise self.fail("jobs", i, "checkpoint_ranks", "expected some of the job's GPUs, not all of them")
        return writers

    def _checkpoint_stuck(self, i: int, job: JobInput) -> float | None:
        at = self.time("jobs", i, "checkpoint_stuck_at", job.checkpoint_stuck_at)
        if at is None:
            return None
        if job.checkpoint_every is None:
            raise self.fail("jobs", i, "checkpoint_stuck_at", "needs checkpoint_every")
        self.inside("jobs", i, "checkpoint_stuck_at", at)
        return at

    def _phases(self, i: int, job: JobInput, kind: str, run_s: float) -> dict[str, float | None]:
        """``checkpoint_duration``, ``eval_every``, ``eval_duration`` and ``first_step``: training only."""
        checkpoint = self.duration("jobs", i, "checkpoint_duration", job.checkpoint_duration)
        every = self.duration("jobs", i, "eval_every", job.eval_every)
        length = self.duration("jobs", i, "eval_duration", job.eval_duration)
        first = self.duration("jobs", i, "first_step", job.first_step)
        given = [
            (k, v)
            for k, v in (
                ("checkpoint_duration", checkpoint),
                ("eval_every", every),
                ("eval_duration", length),
                ("first_step", first),
            )
            if v is not None
        ]
        if given and kind != "training":
            raise self.fail("jobs", i, given[0][0], f"only training jobs have this phase (this job is {kind})")
        if checkpoint is not None:
            checkpoint_every = self.duration("jobs", i, "checkpoint_every", job.checkpoint_every)
            if checkpoint_every is None:
                raise self.fail("jobs", i, "checkpoint_duration", "needs checkpoint_every")
            if checkpoint > MAX_CHECKPOINT_DURATION_S:
                raise self.fail("jobs", i, "checkpoint_duration", "must be at most 15m")
            if checkpoint >= checkpoint_every:
                raise self.fail("jobs", i, "checkpoint_duration", "must be shorter than checkpoint_every")
        if length is not None and every is None:
            raise self.fail("jobs", i, "eval_duration", "needs eval_every")
        if every is not None:
            length = DEFAULT_EVAL_DURATION_S if length is None else length
            if length >= every:
                raise self.fail("jobs", i, "eval_duration", "must be shorter than eval_every")
        if first is not None and first >= run_s:
            raise self.fail("jobs", i, "first_step", "must end before the job does")
        return {
            "checkpoint_duration_s": checkpoint,
            "eval_every_s": every,
            "eval_duration_s": length,
            "first_step_s": first,
        }

    def _check_gpu_sharing(self, jobs: list[JobSpec]) -> None:
        """Only notebook jobs may share a GPU with each other at the same time."""
        holders: dict[GpuRef, list[JobSpec]] = {}
        for i, job in enumerate(jobs):
            for ref in job.gpus:
                for other in holders.get(ref, []):
                    overlap = job.start < other.end and other.start < job.end
                    if overlap and not (job.kind == other.kind == "notebook"):
                        raise self.fail(
                            "jobs",
                            i,
                            "gpus",
                            f"GPU {ref} is held by job {other.id!r} ({other.kind}) at the same time; "
                            "only notebook jobs may share a GPU",
                        )
                holders.setdefault(ref, []).append(job)

    # ----------------------------------------------------------------------------------------- [[faults]]

    def _fault(self, i: int, params: FaultParams) -> FaultSpec:
        kind = FAULT_KINDS[str(params.__struct_config__.tag)]
        at = self.time("faults", i, "at", params.at)
        assert at is not None
        self.inside("faults", i, "at", at)
        target = self._target_key(i, kind, params)
        named = self.text("faults", i, "node" if target == "nic" else target, getattr(params, target_field(target)))
        job = self._fault_job(i, named) if target == "job" else None
        gpu = self.ranges.one_gpu("faults", i, "gpu", named) if target == "gpu" else None
        node_spec = self.ranges.known_node("faults", i, "node", named) if target in ("node", "nic") else None
        nic = self._fault_nic(i, node_spec, getattr(params, "nic", "")) if target == "nic" else None
        if gpu is not None and kind.job_bound:
            job = self._gpu_holder(i, kind.name, gpu, at)
        raw_ranks = kind.ranks(params)
        ranks = () if raw_ranks is None else self.ranges.gpu_list("faults", i, "ranks", raw_ranks)
        raw_stuck = kind.stuck_ranks(params)
        stuck = () if raw_stuck is None else self.ranges.gpu_list("faults", i, "stuck_ranks", raw_stuck)
        if job is not None and stuck:
            if any(ref not in job.gpus for ref in stuck):
                raise self.fail("faults", i, "stuck_ranks", f"names a GPU that is not one of job {job.id!r}'s")
            if len(set(stuck)) >= len(job.gpus):
                raise self.fail("faults", i, "stuck_ranks", "names every GPU of the job: some ranks must launch")
        fault = FaultSpec(
            index=i,
            kind=kind.name,
            start=at,
            end=self._fault_end(i, params, kind.single_event, at, job),
            job=job.id if job else None,
            gpu=gpu,
            node=None if node_spec is None else node_spec.name,
            ranks=ranks,
            stuck=stuck,
            nic=nic,
            jobs_hit=self._jobs_hit(kind, job, node_spec, nic, at),
            step_s=self.step,
            **kind.extras(params),
        )
        if job is not None and not (job.start <= fault.start and fault.end <= job.end + 1e-9):
            key = "duration" if getattr(params, "duration", None) is not None else "at"
            raise self.fail("faults", i, key, f"the fault must lie inside job {job.id!r}'s run")
        try:
            kind.check(fault, job, ScenarioView(self.nodes, self.jobs, self.step))
        except FaultCheckError as problem:
            raise self.fail("faults", i, problem.key, problem.message) from None
        return fault

    def _target_key(self, i: int, kind: FaultKind, params: FaultParams) -> str:
        """Which target the fault names: its kind's, or ``job`` for a kind that may name a job instead."""
        if not kind.job_target and kind.target != "nic":
            return kind.target
        job = getattr(params, "job", None)
        node = getattr(params, "node", None)
        nic = getattr(params, "nic", None)
        named = "a node and a nic" if kind.target == "nic" else "a node"
        alternatives = f"{named}, or a job" if kind.job_target else named
        if job is not None:
            if node is not None or nic is not None:
                raise self.fail("faults", i, "job", f"a {kind.name} fault names {alternatives}, not both")
            return "job"
        if node is None:
            raise self.fail("faults", i, "node", f"missing required key (a {kind.name} fault names {alternatives})")
        if kind.target == "nic" and nic is None:
            raise self.fail("faults", i, "nic", f"missing required key (a {kind.name} fault names {alternatives})")
        return kind.target

    def _fault_nic(self, i: int, node: NodeSpec | None, device: str) -> str:
        """The RDMA device a fault names, which must be one of its node's ports."""
        assert node is not None
        device = self.text("faults", i, "nic", device)
        if node.nic(device) is None:
            have = listing(n.device for n in node.nics) if node.nics else "no RDMA ports"
            raise self.fail(
                "faults", i, "nic", f"{node.name} ({node.model.name}) has no RDMA device {device!r:.40} (it has {have})"
            )
        return device

    def _jobs_hit(
        self, kind: FaultKind, job: JobSpec | None, node: NodeSpec | None, nic: str | None, at: float
    ) -> tuple[str, ...]:
        """The jobs a fabric or host fault reaches (docs/scenarios.md): the job it names, else, by its kind, the
        jobs spanning nodes whose GPUs use its port at ``at``, or every job on its node at ``at``."""
        if not kind.fabric:
            return ()
        if job is not None:
            return (job.id,)
        if node is None or kind.reaches is None:
            return ()
        spec = node.nic(nic) if nic is not None else None
        hit: list[str] = []
        for other in self.jobs.values():
            if not other.running(at):
                continue
            local = [g.index for g in other.gpus if g.node == node.name]
            if kind.reaches == REACHES_PORT_USERS:
                spans = len({g.node for g in other.gpus}) >= 2
                if spec is None or not spans or not set(local) & set(spec.gpus):
                    continue
            elif not local:
                continue
            hit.append(other.id)
        return tuple(hit)

    def _fault_job(self, i: int, job_id: str) -> JobSpec:
        job = self.jobs.get(job_id)
        if job is None:
            raise self.fail("faults", i, "job", f"unknown job {job_id!r} (the scenario has {listing(self.jobs)})")
        return job

    def _gpu_holder(self, i: int, kind: str, gpu: GpuRef, at: float) -> JobSpec:
        """The job a job-bound GPU fault (straggler) acts in: the one holding the GPU at ``at``."""
        for job in self.jobs.values():
            if job.running(at) and gpu in job.gpus:
                return job
        raise self.fail("faults", i, "gpu", f"a {kind} fault needs a job holding {gpu} at its start")

    def _fault_end(self, i: int, params: FaultParams, single: bool, at: float, job: JobSpec | None) -> float:
        if single:
            return self.end  # a single event's effect stays
        duration = self.duration("faults", i, "duration", getattr(params, "duration", None))
        until = job.end if job is not None else self.end  # job-bound kinds last until the job ends
        end = until if duration is None else at + duration
        if end > self.end + 1e-9:
            raise self.fail("faults", i, "duration", "the fault runs past the end of the scenario")
        return end


def target_field(target: str) -> str:
    """The key of a fault's table that names its target (a port is named by ``node``, then ``nic``)."""
    return "node" if target == "nic" else target


def _is_duration(value: Any) -> bool:
    try:
        parse_duration(value)
    except (TypeError, ValueError):
        return False
    return True


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
