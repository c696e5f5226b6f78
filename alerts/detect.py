"""The job detectors: ``CommunicationStall`` (a hung collective) and ``JobStraggler`` (one slow rank).

Both compare a job with its own *reference*: its recent rounds of normal, communicating work, which ``History``
keeps per job (every GPU busy, data moving, clocks even). Neither uses a fixed traffic or power level, so they work
the same on 2 GPUs or 512, on NVLink or PCIe-only nodes, on any GPU model. See docs/alerts-detection.md for the
reasoning and the known limits.

A stall is a multi-GPU job whose NVLink + PCIe traffic fell below ``quiet_ratio`` of the reference on every GPU,
in one of three signatures (the ``signature`` label):

- ``spinning``: every GPU at ~full utilization (a spinning NCCL kernel counts as a running kernel) and power below
  ``power_ratio`` of the reference. Power is the corroboration that tells a hang from a phase of pure compute; when
  the source reads no power, DCGM's SM activity stands in, but only when it is alive (it was clearly above zero in
  the reference), because dead profiling counters read 0 for weeks.
- ``blocked``: every GPU idle (utilization at most ``idle_utilization_max``), the job's memory still held.
- ``mixed``: some GPUs spinning (and cold, as above), the others idle, memory held.

The last two look like a healthy pause (a checkpoint, a data-loader wait) until they last longer than one: they
count only once the job has been pausing for ``blocked_after_s`` and for longer than the longest pause it came back
from, and only for a job whose reference moved at least ``blocked_baseline_traffic_min_bytes_per_second`` per GPU
(collectives, not an inference server's host traffic: an idle server is not a hang). For a job on several nodes
the alert also says what the job's NICs (the ports next to its GPUs) show: a port down, or down and up again within
``fabric_window_s``, goes into the summary ("...; node-03 mlx5_2 (GPUs 4-5) is down since 12:03 UTC"), their state
and traffic into the description and the ``fabric`` annotation.

A straggler is one GPU (at most half of the job) whose SM clock is below ``clock_ratio`` of its peers' median or
that alone has a slowdown reason, whose power differs from its peers' median, while the peers wait: their power fell
below ``peer_power_ratio`` of the reference. While the job is not busy on every GPU (a data-loader pause or a
checkpoint), a pending or firing straggler alert is held as it is rather than reset.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gpulens.alerts.base import AlertRule, Candidate, gpu_name, percent, rate_text, reasons_source_text, rule_labels
from gpulens.alerts.checks import HW_POWER_BRAKE_BIT, HW_SLOWDOWN, SW_POWER_CAP, THERMAL_BITS
from gpulens.alerts.fabricchecks import fabric_evidence
from gpulens.alerts.history import History, JobRound, JobView, Round
from gpulens.alerts.ncclchecks import nccl_stall_candidates
from gpulens.config import format_duration
from gpulens.model import THROTTLE_REASONS, GpuReading, throttle_reason_names

# Clock reasons that make a rank slow (idle, sync boost and application clocks do not).
SLOWDOWN_BITS: Final = THERMAL_BITS | HW_SLOWDOWN | SW_POWER_CAP | HW_POWER_BRAKE_BIT
# Profiling counters read below this in the reference are taken for dead (or a job that never used the SMs).
ALIVE_PROFILING_RATIO: Final = 0.05


@dataclass(frozen=True, slots=True)
class Baseline:
    """A job's reference, as medians over its reference rounds."""

    rounds: int
    traffic: float  # bytes/s per GPU, NVLink + PCIe both directions
    nvlink: float | None
    power: float | None
    sm_active: float | None
    memory: float | None  # bytes used per GPU


SPINNING: Final = "spinning"
BLOCKED: Final = "blocked"
MIXED: Final = "mixed"


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def baseline(reference: Sequence[JobRound], min_rounds: float) -> Baseline | None:
    """The job's baseline from its reference rounds, or ``None`` while it has fewer than ``min_rounds``."""
    if len(reference) < max(1, min_rounds):
        return None
    traffic = _median([r.traffic_median for r in reference])
    if traffic is None:
        return None
    return Baseline(
        rounds=len(reference),
        traffic=traffic,
        nvlink=_median([r.nvlink_median for r in reference]),
        power=_median([r.power_median for r in reference]),
        sm_active=_median([r.sm_active_median for r in reference]),
        memory=_median([r.memory_median for r in reference]),
    )


def _job_baseline(history: History, job_id: str, min_rounds: float) -> Baseline | None:
    """``baseline`` of the job's reference, computed once a round for the rules that share it."""
    memo = history.memo()
    key = ("baseline", job_id, min_rounds)
    if key not in memo:
        reference = history.job_reference(job_id)
        medians = history.job_reference_medians(job_id)  # kept sorted by the history: no sort here
        if medians is None or len(reference) < max(1, min_rounds):
            memo[key] = baseline(reference, min_rounds)
        else:
            traffic, nvlink, power, sm_active, memory = medians
            memo[key] = None if traffic is None else Baseline(len(reference), traffic, nvlink, power, sm_active, memory)
    found: Baseline | None = memo[key]
    return found


def _alive(value: float | None) -> bool:
    return value is not None and value >= ALIVE_PROFILING_RATIO


def _up_readings(latest: Round, view: JobView) -> list[GpuReading]:
    return [r for uuid in view.gpus if (r := latest.gpus.get(uuid)) is not None and r.up]


def _hold(rule: AlertRule, job_id: str) -> Candidate:
    """Nothing can be judged about the job this round: its alerts of ``rule`` keep their state."""
    return Candidate(rule.name, {"job_id": job_id}, None, "", "", hold=True)


def _current(history: History, latest: Round, job_id: str) -> JobRound | None:
    """The job's summary of the latest round (``None`` when none of its GPUs answered)."""
    rounds = history.job_rounds(job_id)
    return rounds[-1] if rounds and rounds[-1].time == latest.time else None


# ------------------------------------------------------------------------------------------------ CommunicationStall


def _cold(power: float | None, sm_active: float | None, base: Baseline, rule: AlertRule) -> bool:
    """Spinning GPUs draw little power (or, without power, show little SM activity on live counters)."""
    if power is not None and base.power is not None:
        return power <= rule.threshold("power_ratio") * base.power
    if _alive(base.sm_active) and sm_active is not None:
        assert base.sm_active is not None
        return sm_active <= rule.threshold("sm_active_ratio") * base.sm_active
    return False  # nothing corroborates a hang: a phase of pure compute looks the same


def _looks_stalled(summary: JobRound, base: Baseline, rule: AlertRule) -> bool:
    """The spinning signature: every GPU busy, no traffic, cold."""
    if summary.gpus < 2 or summary.utilization_min is None or summary.traffic_max is None:
        return False
    if summary.utilization_min < rule.threshold("utilization_min"):
        return False
    if summary.traffic_max > rule.threshold("quiet_ratio") * base.traffic:
        return False
    return _cold(summary.power_max, summary.sm_active_median, base, rule)


def _quiet_and_held(summary: JobRound, base: Baseline, rule: AlertRule) -> bool:
    """No traffic on any GPU, and the job's memory still held (ranks that exited free theirs)."""
    if summary.gpus < 2 or summary.traffic_max is None or summary.utilization_max is None:
        return False
    if summary.traffic_max > rule.threshold("quiet_ratio") * base.traffic:
        return False
    if summary.memory_min is not None and base.memory:
        return summary.memory_min >= rule.threshold("memory_held_ratio") * base.memory
    return True


def _signature(rule: AlertRule, history: History, view: JobView, summary: JobRound, base: Baseline) -> str | None:
    """The hang signature the job shows now, or ``None``."""
    if _looks_stalled(summary, base, rule):
        return SPINNING
    if base.traffic < rule.threshold("blocked_baseline_traffic_min_bytes_per_second"):
        return None  # host traffic only (an inference server): going idle is not a hang
    if not _quiet_and_held(summary, base, rule):
        return None
    pause = history.job_pause(view.job_id)
    if pause.since is None or summary.time - pause.since < max(rule.threshold("blocked_after_s"), pause.longest_s):
        return None  # no longer yet than a healthy pause
    idle = rule.threshold("idle_utilization_max")
    assert summary.utilization_max is not None
    if summary.utilization_max <= idle:
        return BLOCKED
    latest = history.latest
    assert latest is not None
    readings = _up_readings(latest, view)
    busy = rule.threshold("utilization_min")
    spinning = [r for r in readings if r.utilization_ratio is not None and r.utilization_ratio >= busy]
    idle_count = sum(1 for r in readings if r.utilization_ratio is not None and r.utilization_ratio <= idle)
    if not spinning or not idle_count or len(spinning) + idle_count < len(readings):
        return None
    powers = [r.power_watts for r in spinning]
    power = None if None in powers else max(p for p in powers if p is not None)
    sm_active = _median([r.sm_active_ratio for r in spinning])
    return MIXED if _cold(power, sm_active, base, rule) else None


def communication_stall(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    latest = history.latest
    if latest is None:
        return []
    nccl = nccl_stall_candidates(rule, history, now)
    out = list(nccl.values())
    for job_id, view in latest.jobs.items():
        if len(view.gpus) < 2 or job_id in nccl:
            continue  # nobody to talk to; or NCCL named the stuck ranks, which mutes the hardware signatures
        summary = _current(history, latest, job_id)
        if summary is None:
            continue
        base = _job_baseline(history, job_id, rule.threshold("baseline_rounds_min"))
        if base is None:
            out.append(_hold(rule, job_id))  # too new to have a baseline (or the history restarted): no judgement
            continue
        if base.traffic < rule.threshold("baseline_traffic_min_bytes_per_second"):
            continue  # it never communicated
        signature = _signature(rule, history, view, summary, base)
        if signature is not None:
            out.append(_stall_candidate(rule, history, view, summary, base, signature, now))
    return out


def _stall_since(rule: AlertRule, history: History, view: JobView, base: Baseline, signature: str, now: float) -> float:
    """When the job's current hang began: its spinning rounds, or its pause."""
    if signature != SPINNING:
        return history.job_pause(view.job_id).since or now
    since = now
    for past in reversed(history.job_rounds(view.job_id)):
        if not _looks_stalled(past, base, rule):
            break
        since = past.time
    return since


def _stall_candidate(
    rule: AlertRule, history: History, view: JobView, summary: JobRound, base: Baseline, signature: str, now: float
) -> Candidate:
    since = _stall_since(rule, history, view, base, signature, now)
    link = "NVLink" if base.nvlink is not None and base.nvlink >= 0.5 * base.traffic else "PCIe"
    util = summary.utilization_median or 0.0
    duration = f" for {format_duration(now - since)}" if now > since else ""
    traffic_now = summary.traffic_max or 0.0
    power = (
        f" and power from {base.power:.0f} W to {summary.power_median:.0f} W"
        if base.power is not None and summary.power_median is not None
        else ""
    )
    fell = (
        f"traffic per GPU fell from {rate_text(base.traffic)} (the job's baseline over {base.rounds} rounds) to "
        f"{rate_text(traffic_now)}{power}"
    )
    if signature == SPINNING:
        summary_text = f"job {view.job_id}: {summary.gpus} GPUs at {percent(util)} with no {link} traffic{duration}"
        evidence = (
            f"Every GPU of the job shows {percent(util)} utilization, but {fell}: its GPUs spin in a collective "
            "that does not complete (an NCCL hang)."
        )
    elif signature == BLOCKED:
        summary_text = f"job {view.job_id}: {summary.gpus} GPUs idle with memory held and no {link} traffic{duration}"
        evidence = (
            f"Every GPU of the job is idle with its memory held, and {fell}, for longer than any pause the job came "
            "back from: its ranks are blocked on the host (a hang outside the GPU, or a rank that died)."
        )
    else:
        latest = history.latest
        assert latest is not None
        idle = sum(1 for r in _up_readings(latest, view) if _idle(rule, r))
        summary_text = (
            f"job {view.job_id}: {summary.gpus - idle} GPUs spinning and {idle} idle with no {link} traffic{duration}"
        )
        evidence = (
            f"Some GPUs of the job spin at full utilization while {idle} sit idle, and {fell}, for longer than any "
            "pause the job came back from: the spinning ranks wait in a collective for ranks that are blocked "
            "or gone."
        )
    fault, fabric = _fabric(rule, history, view, now)
    if fault:
        summary_text += f"; {fault}"
    description = evidence + (f" {fabric}" if fabric else "") + (f" User {view.user}." if view.user else "")
    labels = rule_labels(rule, {"job_id": view.job_id, "user": view.user or "", "signature": signature})
    annotations = {"fabric": fabric} if fabric else {}
    return Candidate(
        rule.name, labels, traffic_now / base.traffic, summary_text, description, annotations=annotations, began=since
    )


def _fabric(rule: AlertRule, history: History, view: JobView, now: float) -> tuple[str | None, str]:
    """What the ports of a job on several nodes show (see ``fabricchecks.fabric_evidence``)."""
    latest = history.latest
    assert latest is not None
    gpus: dict[str, list[int]] = {}
    for uuid in view.gpus:
        if (reading := latest.gpus.get(uuid)) is not None:
            gpus.setdefault(reading.node, []).append(reading.gpu)
    if len(gpus) < 2:
        return None, ""
    return fabric_evidence(history, gpus, rule.threshold("fabric_window_s"), now)


def _idle(rule: AlertRule, reading: GpuReading) -> bool:
    return reading.utilization_ratio is not None and reading.utilization_ratio <= rule.threshold("idle_utilization_max")


# ------------------------------------------------------------------------------------------------ JobStraggler


@dataclass(frozen=True, slots=True)
class _Rank:
    reading: GpuReading
    clock_ratio: float | None
    power_ratio: float  # its power over the peers' median power
    peer_power: float
    reasons: list[str]


def _median_without(ordered: list[float], value: float) -> float | None:
    """The median of the sorted list ``ordered`` less one occurrence of ``value`` (which it holds)."""
    n = len(ordered) - 1
    if n <= 0:
        return None
    i = bisect.bisect_left(ordered, value)

    def at(k: int) -> float:
        return ordered[k] if k < i else ordered[k + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2.0


class _Job:
    """A busy job's GPUs this round, arranged so each GPU's peers (the others) are cheap to summarise."""

    def __init__(self, readings: list[GpuReading]) -> None:
        self.size = len(readings)
        self.powers = sorted(r.power_watts for r in readings if r.power_watts is not None)
        self.clocks = sorted(r.sm_clock_hertz for r in readings if r.sm_clock_hertz)
        self.reasons = {bit: sum(1 for r in readings if (r.throttle_reasons or 0) & bit) for _, bit in THROTTLE_REASONS}

    def lone_reasons(self, reading: GpuReading) -> list[str]:
        """Slowdown reasons set on ``reading`` and on fewer than half of its peers."""
        bits = (reading.throttle_reasons or 0) & SLOWDOWN_BITS
        peers = self.size - 1
        lone = 0
        for _, bit in THROTTLE_REASONS:
            if bits & bit and (self.reasons[bit] - 1) * 2 < peers:
                lone |= bit
        return throttle_reason_names(lone)


def job_straggler(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    latest = history.latest
    if latest is None:
        return []
    out: list[Candidate] = []
    for job_id, view in latest.jobs.items():
        if len(view.gpus) < 2:
            continue
        base = _job_baseline(history, job_id, rule.threshold("baseline_rounds_min"))
        readings = _up_readings(latest, view)
        if len(readings) < 2:
            continue
        busy = rule.threshold("busy_utilization")
        if base is None or any(r.utilization_ratio is None or r.utilization_ratio < busy for r in readings):
            # No baseline yet, or a data-loader pause or a checkpoint: keep any straggler alert as it is.
            out.append(_hold(rule, job_id))
            continue
        if base.power is None:
            continue  # without power, peers waiting cannot be told from peers working
        if not _peers_may_wait(readings, rule.threshold("peer_power_ratio") * base.power):
            continue
        job = _Job(readings)
        slow = [rank for r in readings if (rank := _straggling(rule, r, job, base.power)) is not None]
        if slow and len(slow) * 2 <= len(readings):
            out.extend(_straggler_candidate(rule, view, rank, len(readings)) for rank in slow)
    return out


def _peers_may_wait(readings: list[GpuReading], limit: float) -> bool:
    """Whether some GPU's peers' median power can be at most ``limit`` (``_straggling``'s last test).

    The peers' median of a GPU is the median of the job's powers less its own, which is lowest for the GPU drawing
    the most: when even that median is above ``limit``, no GPU of a healthy busy job can be a straggler, and the
    per-GPU tests are skipped.
    """
    powers = sorted(r.power_watts for r in readings if r.power_watts is not None)
    if not powers:
        return False  # no GPU reads power: ``_straggling`` finds none
    total = sum(powers)
    if total != total:  # a NaN (or infinities) among them: the order above does not hold, so test each GPU
        return True
    lowest = _median_without(powers, powers[-1])
    return lowest is None or not lowest > limit


def _straggling(rule: AlertRule, reading: GpuReading, job: _Job, base_power: float) -> _Rank | None:
    """The rank's evidence when ``reading`` is a straggler in ``job``, else ``None``."""
    if reading.power_watts is None:
        return None
    peer_power = _median_without(job.powers, reading.power_watts)
    if not peer_power:
        return None
    power_ratio = reading.power_watts / peer_power
    if abs(power_ratio - 1.0) < rule.threshold("power_difference"):
        return None
    peer_clock = _median_without(job.clocks, reading.sm_clock_hertz) if reading.sm_clock_hertz else None
    clock_ratio = reading.sm_clock_hertz / peer_clock if reading.sm_clock_hertz and peer_clock else None
    reasons = job.lone_reasons(reading)
    if not reasons and (clock_ratio is None or clock_ratio > rule.threshold("clock_ratio")):
        return None
    if peer_power > rule.threshold("peer_power_ratio") * base_power:
        return None  # the peers do not wait for it
    return _Rank(reading, clock_ratio, power_ratio, peer_power, reasons)


def _straggler_candidate(rule: AlertRule, view: JobView, rank: _Rank, gpus: int) -> Candidate:
    reading = rank.reading
    subject = {
        "node": reading.node,
        "gpu": str(reading.gpu),
        "uuid": reading.uuid,
        "job_id": view.job_id,
        "user": view.user or "",
    }
    labels = rule_labels(rule, subject)
    slower = f"at {percent(rank.clock_ratio)} of its peers' SM clock" if rank.clock_ratio is not None else "slow"
    reasons = f" ({', '.join(rank.reasons)}{reasons_source_text(reading)})" if rank.reasons else ""
    summary = f"job {view.job_id}: GPU {gpu_name(labels)} {slower}{reasons} holds back {gpus - 1} GPUs"
    power = reading.power_watts or 0.0
    description = (
        f"GPU {gpu_name(labels)} draws {power:.0f} W against its peers' median {rank.peer_power:.0f} W, and the "
        "peers' power fell below the job's baseline: they wait for it in every collective, so the whole job runs "
        "at its pace." + (f" User {view.user}." if view.user else "")
    )
    value = rank.clock_ratio if rank.clock_ratio is not None else rank.power_ratio
    return Candidate(rule.name, labels, value, summary, description)
