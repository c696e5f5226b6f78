"""How jobs behave, step by step, before per-GPU noise: a job's phase at each step, and what that phase does to a GPU.

Figures are step averages. A training job alternates compute and all-reduce within an iteration of a few seconds;
a step of 10 s averages several iterations, so NVLink traffic stays well above zero, while a 1 s step shows the
alternation itself. Its healthy phases besides that: data-loader pauses, checkpoints (a device-to-host burst, then,
for a long checkpoint, the GPUs idle while the host writes), evaluation phases and a slow first step (compilation
and warm-up) are the confounders a hang detector must stay quiet on (docs/scenarios.md).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Final

from gpulens.exporter.sim import noise
from gpulens.exporter.sim.faults import FAULT_KINDS, PHASE_KINDS
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import (
    BURST,
    CHECKPOINT,
    CHECKPOINT_WRITE,
    DATA_WAIT,
    EVAL,
    IDLE,
    QUIET,
    RUN,
    SERVE,
    SPIN_LOAD,
    WARMUP,
    Activity,
    JobPhase,
    Levels,
    Placement,
    RankShare,
    idle_activity,
)

# How a fault splits a training rank's step, given the step's all-reduce share.
RankShaper = Callable[[float], RankShare]

DATA_WAIT_PROBABILITY: Final = 0.04  # per step, training only, all ranks together
NOTEBOOK_BURST_PROBABILITY: Final = 0.35
NOTEBOOK_BLOCK_S: Final = 60.0  # a notebook is busy or quiet for a minute at a time
WARMUP_BURST_PROBABILITY: Final = 0.1  # per step of a slow first step: a warm-up iteration or a kernel autotune


class JobBehaviour:
    """The phases of one job. ``faults`` are the job-bound faults acting on it (job-scoped ones and stragglers)."""

    def __init__(self, job: JobSpec, faults: tuple[FaultSpec, ...], seed: int, origin: float, step_s: float) -> None:
        self.job = job
        self.faults = faults
        self._origin = origin
        self._step = step_s
        self._key = noise.key(seed, "job", job.id)
        self._checkpoint_key = noise.key(seed, "checkpoint", job.id)
        self._warmup_key = noise.key(seed, "warmup", job.id)
        self._work_start = job.start + (job.first_step_s or 0.0)  # when the first step is over
        self.multi_gpu = len(job.gpus) >= 2
        self.period_s = 2.0 + 4.0 * noise.unit(seed, "period", job.id)
        self.comm_share = 0.25 + 0.10 * noise.unit(seed, "comm", job.id)
        self.offset_s = self.period_s * noise.unit(seed, "offset", job.id)
        self.load_period_s = 1200.0 + 2400.0 * noise.unit(seed, "load", job.id)

    def phase(self, k: int) -> JobPhase | None:
        """The job's phase at step ``k``, or ``None`` when it does not run then."""
        t = self._origin + k * self._step
        if not self.job.running(t):
            return None
        active = [f for f in self.faults if f.active(t)] if self.faults else []
        if active:
            taken = _taken_over(active, t)
            if taken is not None:
                return taken
        kind = self.job.kind
        if kind == "idle":
            return JobPhase(IDLE)
        if kind == "inference":
            return JobPhase(SERVE, intensity=self._serving_load(t))
        if kind == "notebook":
            return self._notebook(t)
        if not active:  # while a job-bound fault acts the job takes no pauses, so its signature is unbroken
            if t < self._work_start:
                return self._warmup(k, t)
            checkpoint = self._checkpointing(k, t)
            if checkpoint is not None:
                return JobPhase(checkpoint)
            if self._in_window(t, self.job.eval_every_s, self.job.eval_duration_s):
                return JobPhase(EVAL)
            if k > self._first_step() and noise.value(self._key, k) < DATA_WAIT_PROBABILITY:
                return JobPhase(DATA_WAIT)
        return JobPhase(RUN, comm_fraction=self._comm_fraction(t) if self.multi_gpu else 0.0)

    def _first_step(self) -> int:
        """The scenario step at which the job's work begins (after its slow first step, if any)."""
        return math.ceil((self._work_start - self._origin) / self._step - 1e-9)

    def _warmup(self, k: int, t: float) -> JobPhase:
        """The slow first step: mostly idle (compiling on the host), now and then a warm-up burst, memory growing."""
        done = (t - self.job.start) / (self._work_start - self.job.start)
        burst = noise.value(self._warmup_key, k) < WARMUP_BURST_PROBABILITY
        return JobPhase(WARMUP, intensity=done, activity=functools.partial(_warming_up, done, burst))

    def _checkpointing(self, k: int, t: float) -> str | None:
        """``CHECKPOINT`` while the ranks copy a checkpoint to the host, ``CHECKPOINT_WRITE`` while the host writes
        it (only with ``checkpoint_duration``, or from the save that never ends, ``checkpoint_stuck_at``), ``None``
        otherwise."""
        every = self.job.checkpoint_every_s
        if every is None:
            return None
        n = math.floor((t - self._work_start) / every + 1e-9)
        if n < 1:
            return None
        first = math.ceil((self._work_start + n * every - self._origin) / self._step - 1e-9)
        stuck = self.job.checkpoint_stuck_s
        if stuck is not None:  # the first save from then on never ends (its writers stuck in I/O)
            m = max(1, math.ceil((stuck - self._work_start) / every - 1e-9))
            first_stuck = math.ceil((self._work_start + m * every - self._origin) / self._step - 1e-9)
            if k >= first_stuck:
                copy = 1 + int(3 * noise.value(self._checkpoint_key, m))
                return CHECKPOINT if k < first_stuck + copy else CHECKPOINT_WRITE
        copy = 1 + int(3 * noise.value(self._checkpoint_key, n))  # 1-3 steps, fixed per checkpoint
        duration = self.job.checkpoint_duration_s
        length = copy if duration is None else max(1, math.ceil(duration / self._step - 1e-9))
        if not first <= k < first + length:
            return None
        return CHECKPOINT if k < first + copy else CHECKPOINT_WRITE

    def _in_window(self, t: float, every: float | None, length: float | None) -> bool:
        """Whether ``t`` falls in one of the periodic windows of ``length`` every ``every`` (the first after one
        period of work)."""
        if every is None or length is None:
            return False
        n = math.floor((t - self._work_start) / every + 1e-9)
        return n >= 1 and t < self._work_start + n * every + length - 1e-9

    def _comm_fraction(self, t: float) -> float:
        """The share of [t, t + step) spent in all-reduce: a square wave of period ``period_s`` averaged."""
        a = t - self.job.start + self.offset_s
        return (self._comm_time(a + self._step) - self._comm_time(a)) / self._step

    def _comm_time(self, x: float) -> float:
        """All-reduce time in [0, x) when each iteration computes first and communicates for its last share."""
        period, share = self.period_s, self.comm_share
        full, rest = divmod(x, period)
        return full * share * period + max(0.0, rest - (1.0 - share) * period)

    def _serving_load(self, t: float) -> float:
        return 0.9 + 0.06 * math.sin(2.0 * math.pi * (t - self.job.start) / self.load_period_s + self.offset_s)

    def _notebook(self, t: float) -> JobPhase:
        block = math.floor((t - self.job.start) / max(NOTEBOOK_BLOCK_S, self._step))
        u = noise.value(self._key, block)
        if u < NOTEBOOK_BURST_PROBABILITY:
            return JobPhase(BURST, intensity=0.3 + 0.6 * u / NOTEBOOK_BURST_PROBABILITY)
        return JobPhase(QUIET)


def _taken_over(active: list[FaultSpec], t: float) -> JobPhase | None:
    """The phase of the first active fault (by priority) whose kind takes over its job's phase at ``t``."""
    for kind in PHASE_KINDS:
        for fault in active:
            if fault.kind == kind.name and kind.takes_phase(fault, t):
                return kind.job_phase(fault)
    return None


def rank_shaper(active: list[tuple[FaultSpec, str]]) -> RankShaper | None:
    """While a fault that reshapes training ranks acts on this GPU's job: how it splits each rank's step, as seen
    from this GPU (its target, role "self", or a peer in the job)."""
    for fault, role in active:
        kind = FAULT_KINDS[fault.kind]
        if kind.shapes_ranks:
            return functools.partial(kind.rank_share, role == "self")
    return None


def activity(phase: JobPhase, place: Placement, shaper: RankShaper | None) -> Activity:
    """What ``phase`` does to one GPU of the job; ``shaper`` from :func:`rank_shaper` while a fault reshapes
    the job's ranks."""
    memory = place.job.memory_fraction
    mode = phase.mode
    if phase.activity is not None:
        return phase.activity(place)
    if mode == RUN:
        return _training(phase, place, shaper)
    if mode == DATA_WAIT:
        return Activity(0.08, 0.05, 0.01, 0.03, 0.10, 0.0, 0.005, 0.06, memory, True, True)
    if mode == CHECKPOINT:
        return Activity(0.04, 0.03, 0.0, 0.08, 0.08, 0.0, 0.55, 0.01, memory, True, True)
    if mode == CHECKPOINT_WRITE:  # the host writes the copy out: the GPUs idle, memory held, nothing moves
        return Activity(0.0, 0.0, 0.0, 0.0, 0.01, 0.0, 2e-4, 2e-4, memory, False, False)
    if mode == EVAL:  # forward passes only, a metric all-reduce now and then
        nvlink = 0.004 if place.nvlink_peers else 0.0
        return Activity(0.62, 0.4, 0.28, 0.3, 0.45, nvlink, 0.012, 0.03, memory, True, True)
    if mode == SERVE:
        i = phase.intensity
        return Activity(i, 0.78 * i, 0.45 * i, 0.65 * i, 0.78 * i, 0.0, 0.012 * i, 0.015 * i, memory, True, False)
    if mode == BURST:
        i = phase.intensity
        return Activity(i, 0.7 * i, 0.4 * i, 0.35 * i, 0.7 * i, 0.0, 0.01 * i, 0.03 * i, memory, True, True)
    return idle_activity(memory)  # IDLE, QUIET


# Signal levels of the three things a training rank does within a step: compute, all-reduce, and spinning in a
# collective while it waits for a slower rank: (sm_active, tensor_active, dram_active, power load).
_COMPUTE: Final[Levels] = (0.86, 0.62, 0.45, 0.92)
_ALL_REDUCE: Final[Levels] = (0.12, 0.02, 0.25, 0.45)
_SPIN: Final[Levels] = (0.03, 0.0, 0.01, SPIN_LOAD)
_ALL_REDUCE_LINK_SHARE: Final = 0.70


def _training(phase: JobPhase, place: Placement, shaper: RankShaper | None) -> Activity:
    f = phase.comm_fraction
    share = RankShare(1.0 - f, f, 0.0) if shaper is None else shaper(f)
    compute, comm, spin, pace = share.compute, share.comm, share.spin, share.pace
    reduce_levels = _ALL_REDUCE if phase.all_reduce is None else phase.all_reduce
    sm, tensor, dram, load = (
        compute * c + comm * r + spin * w for c, r, w in zip(_COMPUTE, reduce_levels, _SPIN, strict=True)
    )
    load *= share.load_factor
    link_level = _ALL_REDUCE_LINK_SHARE if phase.link_share is None else phase.link_share
    nvlink = (link_level * f + 0.02 * (1.0 - f)) * pace if place.nvlink_peers else 0.0
    inter_node = 0.30 * f * pace if place.nodes > 1 else 0.0
    intra_pcie = 0.45 * f * pace if place.local_gpus >= 2 and not place.nvlink else 0.0
    return Activity(
        utilization=0.97,
        sm_active=sm,
        tensor_active=tensor,
        dram_active=dram,
        load=load,
        nvlink=nvlink,
        pcie_tx=0.01 + inter_node + intra_pcie,
        pcie_rx=0.02 + inter_node + intra_pcie,
        memory_fraction=place.job.memory_fraction,
        busy=True,
        memory_jitter=True,
    )


def _warming_up(done: float, burst: bool, place: Placement) -> Activity:
    """A GPU during its job's slow first step, ``done`` (0-1) of the way through; ``burst``: a warm-up iteration."""
    memory = place.job.memory_fraction * (0.1 + 0.9 * done)
    if burst:
        return Activity(0.4, 0.3, 0.2, 0.2, 0.3, 0.0, 0.01, 0.02, memory, True, True)
    return Activity(0.02, 0.01, 0.0, 0.01, 0.02, 0.0, 0.002, 0.02, memory, False, True)


def combine(activities: list[Activity]) -> Activity:
    """Jobs sharing one GPU (notebooks): their work adds up, within the GPU's limits."""
    if len(activities) == 1:
        return activities[0]
    return Activity(
        utilization=min(1.0, sum(a.utilization for a in activities)),
        sm_active=min(1.0, sum(a.sm_active for a in activities)),
        tensor_active=min(1.0, sum(a.tensor_active for a in activities)),
        dram_active=min(1.0, sum(a.dram_active for a in activities)),
        load=min(1.0, sum(a.load for a in activities)),
        nvlink=min(1.0, sum(a.nvlink for a in activities)),
        pcie_tx=min(1.0, sum(a.pcie_tx for a in activities)),
        pcie_rx=min(1.0, sum(a.pcie_rx for a in activities)),
        memory_fraction=min(1.0, sum(a.memory_fraction for a in activities)),
        busy=any(a.busy for a in activities),
        memory_jitter=any(a.memory_jitter for a in activities),
    )
