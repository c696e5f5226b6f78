"""What a scenario's faults call for, and how the alerts that fired compare with it.

``expected_alerts`` reads a scenario's faults (and its ``idle`` jobs) and says which alert each must raise, on which
GPU, node or job, and when; ``score`` matches the alerts a replay fired against them: detected faults, time to
detect, missed faults and false alerts; ``tally`` sums outcomes per fault kind and per rule. The tests assert on it
and ``bench/bench_alerts.py`` reports it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

from gpulens.alerts.base import AlertRule
from gpulens.alerts.catalogue import (
    COMMUNICATION_STALL,
    EXPORTER_DOWN,
    FABRIC_CONGESTION,
    FABRIC_SATURATED,
    GPU_CONFIG_DRIFT,
    GPU_DRIVER_HUNG,
    GPU_FABRIC_NOT_READY,
    GPU_LOST,
    GPU_MISSING,
    IB_ERRORS,
    IB_LINK_DEGRADED,
    IB_LINK_DOWN,
    IB_LINK_FLAPPING,
    IDLE_ALLOCATED,
    JOB_COMMUNICATION_SLOW,
    JOB_INEFFICIENT,
    JOB_INPUT_BOUND,
    JOB_STRAGGLER,
    MEMORY_SATURATED,
    NVLINK_ERRORS,
    NVLINK_SATURATED,
    NVSWITCH_FATAL_SXID,
    PAGING_XIDS,
    PCIE_DEGRADED,
    PCIE_SATURATED,
    POWER_CAPPED,
    THERMAL_THROTTLING,
    XID_ERROR,
)
from gpulens.alerts.names import HOST_CPU_CONTENTION, HOST_MEMORY_PRESSURE
from gpulens.alerts.replay import FiredAlert, replay
from gpulens.alerts.rules import builtin_rules
from gpulens.exporter.sim import FaultSpec, GpuRef, Scenario, SimCluster, parse_scenario
from gpulens.exporter.sim.cluster import LEAK_TARGET_SHARE
from gpulens.xidcatalogue import sxid_severity

# Detectors held to "fire within `for` plus two scrape intervals" on a real fault (plus, for a blocked or mixed
# hang, the wait past the longest healthy pause, ``blocked_after_s``).
BOUNDED = (COMMUNICATION_STALL, JOB_STRAGGLER)
MEMORY_RATIO = 0.95
# The hang kinds and the signature each must show.
HANG_SIGNATURES: Final = {
    "comm_stall": "spinning",
    "hang_spinning": "spinning",
    "hang_blocked": "blocked",
    "hang_mixed": "mixed",
}
# The fabric fault kinds that raise one alert per port they act on.
PORT_ALERTS: Final = {
    "ib_link_down": IB_LINK_DOWN,
    "ib_degraded": IB_LINK_DEGRADED,
    "ib_errors": IB_ERRORS,
    "fabric_congestion": FABRIC_CONGESTION,
    "fabric_saturation": FABRIC_SATURATED,
}


@dataclass(frozen=True)
class Expected:
    """An alert a cause calls for: ``alertname`` on the subject whose labels include ``match``, from ``start``."""

    alertname: str
    match: Mapping[str, str]
    start: float
    end: float
    required: bool = True  # False: the alert may fire, but need not (a cause too short or too faint)
    cause: str = ""
    wait_s: float = 0.0  # how long past its `for` the rule may wait before it can tell the cause from a pause

    def accepts(self, alert: FiredAlert, slack_s: float) -> bool:
        return (
            alert.alertname == self.alertname
            and all(alert.labels.get(k) == v for k, v in self.match.items())
            and self.start - 1e-6 <= alert.starts_at <= self.end + slack_s
        )


@dataclass
class Outcome:
    """A replay's alerts scored against its causes."""

    name: str
    expected: list[Expected]
    fired: list[FiredAlert]
    detected: dict[int, FiredAlert] = field(default_factory=dict)  # index into expected -> first match
    false_alerts: list[FiredAlert] = field(default_factory=list)
    refired: list[FiredAlert] = field(default_factory=list)  # a second firing for one cause (flapping)
    seconds: float = 0.0
    rounds: int = 0
    causes: dict[str, str] = field(default_factory=dict)  # every fault (and idle job) -> its kind

    @property
    def missed(self) -> list[Expected]:
        return [e for i, e in enumerate(self.expected) if e.required and i not in self.detected]

    @property
    def required(self) -> int:
        return sum(1 for e in self.expected if e.required)

    def late(self, rules: Sequence[AlertRule], step_s: float) -> list[tuple[Expected, float]]:
        """Causes of the ``BOUNDED`` rules detected before they began or later than their bound, with the delay."""
        out = []
        for i, alert in self.detected.items():
            e = self.expected[i]
            if e.alertname in BOUNDED:
                delay = alert.starts_at - e.start
                if not 0 <= delay <= bound_s(e.alertname, rules, step_s) + e.wait_s:
                    out.append((e, delay))
        return out

    def delays(self, alertname: str | None = None) -> list[float]:
        """Seconds from each detected cause's start to its alert firing."""
        return [
            a.starts_at - self.expected[i].start
            for i, a in self.detected.items()
            if alertname is None or a.alertname == alertname
        ]

    def describe(self) -> str:
        lines = [f"{self.name}:"]
        lines += [f"  missed {e.alertname} {dict(e.match)} ({e.cause})" for e in self.missed]
        lines += [f"  false {a.alertname} {a.labels} at {a.starts_at}: {a.summary}" for a in self.false_alerts]
        lines += [f"  refired {a.alertname} {a.labels} at {a.starts_at}" for a in self.refired]
        return "\n".join(lines)


def _gpu(ref: GpuRef | None) -> dict[str, str]:
    assert ref is not None
    return {"node": ref.node, "gpu": str(ref.index)}


class _Expectations:
    def __init__(self, scenario: Scenario, rules: Mapping[str, AlertRule]) -> None:
        self.scenario = scenario
        self.rules = rules
        self.step = scenario.step_s
        self.nodes = {n.name: n for n in scenario.nodes}
        self.jobs = {j.id: j for j in scenario.jobs}
        self.out: list[Expected] = []

    def long_enough(self, alertname: str, start: float, end: float, wait_s: float = 0.0) -> bool:
        return end - start >= self.rules[alertname].for_s + wait_s + 2 * self.step

    def add(
        self, alertname: str, match: Mapping[str, str], start: float, end: float, cause: str, wait_s: float = 0.0
    ) -> None:
        required = self.long_enough(alertname, start, end, wait_s)
        self.out.append(Expected(alertname, dict(match), start, end, required, cause, wait_s))

    def jobs_on(self, ref: GpuRef, t: float) -> list[str]:
        return [j.kind for j in self.scenario.jobs if ref in j.gpus and j.running(t)]

    def slow_collectives(self, f: FaultSpec, cause: str) -> None:
        """JobCommunicationSlow on each job running NCCL's Inspector that the fault slows (a port fault: the jobs
        crossing the port; docs/nccl-inspector.md, "In the simulator")."""
        for job in self.scenario.jobs:
            if not job.nccl_inspector or job.kind != "training" or len(job.gpus) < 2:
                continue
            nic = self.nodes[f.node].nic(f.nic) if f.node in self.nodes and f.nic else None
            spans = len({g.node for g in job.gpus}) > 1
            beside = nic is not None and any(g.node == f.node and g.index in nic.gpus for g in job.gpus)
            if f.job == job.id or job.id in f.jobs_hit or (f.kind != "straggler" and spans and beside):
                self.add(JOB_COMMUNICATION_SLOW, {"job_id": job.id}, f.start, f.end, cause + " (Inspector)")

    def fault(self, f: FaultSpec) -> None:
        cause = f"{f.kind} #{f.index}"
        s, e = f.start, f.end
        if f.kind in ("fabric_congestion", "ib_degraded", "straggler"):
            self.slow_collectives(f, cause)
        simple = {
            "thermal_throttle": THERMAL_THROTTLING,
            "pcie_degraded": PCIE_DEGRADED,
            "pcie_saturation": PCIE_SATURATED,
            "nvlink_errors": NVLINK_ERRORS,
        }
        if f.kind in simple:
            self.add(simple[f.kind], _gpu(f.gpu), s, e, cause)
        elif f.kind in HANG_SIGNATURES:
            self.hang(f, cause)
        elif f.kind == "rank_dead":
            if self.jobs[str(f.job)].nccl_ras:
                self.add(COMMUNICATION_STALL, {"job_id": str(f.job), "signature": "rank_dead"}, s, e, cause)
            else:  # the others spin, the dead rank's GPU idles with its memory freed: no hardware signature holds
                wait = self.rules[COMMUNICATION_STALL].threshold("blocked_after_s")
                self.add(COMMUNICATION_STALL, {"job_id": str(f.job), "signature": "mixed"}, s, e, cause, wait)
                self.out[-1] = replace(self.out[-1], required=False)
            if f.gpu is not None:  # its GPU idles: an idle allocation too, should it last
                self.add(IDLE_ALLOCATED, {**_gpu(f.gpu), "job_id": str(f.job)}, s, e, cause + " (dead rank)")
        elif f.kind == "straggler":
            self.add(JOB_STRAGGLER, {**_gpu(f.gpu), "job_id": str(f.job)}, s, e, cause)
            self.add(THERMAL_THROTTLING, _gpu(f.gpu), s, e, cause + " (sw_thermal)")
        elif f.kind == "memory_leak":
            self.memory_leak(f, cause)
        elif f.kind == "power_cap":
            self.power_cap(f, cause)
        elif f.kind in ("xid", "kernel_xid") and f.xid in PAGING_XIDS:  # a lost GPU's too: the kernel log has it
            self.add(XID_ERROR, {**_gpu(f.gpu), "xid": str(f.xid)}, s, self.scenario.end, cause)
        elif f.kind == "gpu_lost":
            self.add(GPU_LOST, _gpu(f.gpu), s, math.inf, cause)
        elif f.kind == "idle_allocated":
            for ref in self.jobs[str(f.job)].gpus:
                self.add(IDLE_ALLOCATED, {**_gpu(ref), "job_id": str(f.job)}, s, e, cause)
        elif f.kind == "exporter_down":
            self.add(EXPORTER_DOWN, {"node": str(f.node)}, s, e, cause)
        elif f.kind in ("gpu_missing", "fabric_not_ready", "peermem_missing"):
            self.hardware(f, cause)
        elif f.kind == "nvml_hang":
            self.add(GPU_DRIVER_HUNG, {"node": str(f.node)}, s, e, cause)
        elif f.kind == "sxid" and sxid_severity(int(f.xid or 0)) == "fatal":  # until the agent starts afresh
            self.add(NVSWITCH_FATAL_SXID, {"node": str(f.node), "sxid": str(f.xid)}, s, self.scenario.end, cause)
        elif f.kind in PORT_ALERTS or f.kind in ("ib_link_flap", "host_cpu_contention", "host_memory_pressure"):
            self.fabric(f, cause)
        elif f.kind == "nvlink_saturation":
            job = self.jobs[str(f.job)]
            for ref in job.gpus:
                local = sum(1 for g in job.gpus if g.node == ref.node)
                if self.nodes[ref.node].model.has_nvlink and local >= 2:
                    self.add(NVLINK_SATURATED, {**_gpu(ref), "job_id": job.id}, s, e, cause)

    def hardware(self, f: FaultSpec, cause: str) -> None:
        """A missing GPU by its node (the address is the check tests'); a fabric not ready on the node's fabric
        manager and each of its GPUs; peermem missing as drift, where enough nodes with RDMA ports make a majority."""
        s, e = f.start, f.end
        if f.kind == "gpu_missing":
            assert f.gpu is not None
            self.add(GPU_MISSING, {"node": f.gpu.node}, s, math.inf, cause)
        elif f.kind == "fabric_not_ready":
            node = str(f.node)
            self.add(GPU_FABRIC_NOT_READY, {"node": node, "service": "nv-fabricmanager"}, s, e, cause)
            for i in range(self.nodes[node].gpus):
                self.add(GPU_FABRIC_NOT_READY, {"node": node, "gpu": str(i)}, s, e, cause)
        else:
            rule = self.rules[GPU_CONFIG_DRIFT]
            self.add(GPU_CONFIG_DRIFT, {"node": str(f.node), "setting": "nvidia_peermem"}, s, e, cause)
            rdma = sum(1 for n in self.scenario.nodes if n.nics)
            if 2 * (rdma - 1) <= rdma or rdma < rule.threshold("min_peers"):  # no majority without it
                self.out[-1] = replace(self.out[-1], required=False)

    def hang(self, f: FaultSpec, cause: str) -> None:
        """The stall with its signature; a blocked or mixed one once it outlasts a healthy pause. Ranks that sit
        idle long enough are idle allocations too."""
        signature = HANG_SIGNATURES[f.kind]
        if f.stuck and self.jobs[str(f.job)].nccl_ras:
            signature = "rank_missing"  # NCCL RAS names the ranks: the hardware signatures are muted
        slow = signature in ("blocked", "mixed")
        wait = self.rules[COMMUNICATION_STALL].threshold("blocked_after_s") if slow else 0.0
        match = {"job_id": str(f.job), "signature": signature}
        self.add(COMMUNICATION_STALL, match, f.start, f.end, cause, wait)
        idle = self.jobs[str(f.job)].gpus if f.kind == "hang_blocked" else f.ranks
        for ref in idle:
            self.add(IDLE_ALLOCATED, {**_gpu(ref), "job_id": str(f.job)}, f.start, f.end, cause + " (idle rank)")

    def ports(self, f: FaultSpec) -> list[dict[str, str]]:
        """The ports a fabric fault acts on: the one it names, or every port next to its job's GPUs."""
        if f.nic is not None:
            return [{"node": str(f.node), "device": f.nic}]
        job = self.jobs[str(f.job)]
        out = []
        for name in dict.fromkeys(g.node for g in job.gpus):
            held = {g.index for g in job.gpus if g.node == name}
            out += [{"node": name, "device": n.device} for n in self.nodes[name].nics if held & set(n.gpus)]
        return out

    def fabric(self, f: FaultSpec, cause: str) -> None:
        """A port fault's alert on each port; a down link also hangs the multi-node training jobs on it (their stall,
        annotated with the link as its cause, a member of its incident); a flap fires once enough flaps fall in the
        window; a starved job is input-bound (under memory pressure, every training job on the node)."""
        s, e = f.start, f.end
        if f.kind in PORT_ALERTS:
            for match in self.ports(f):
                self.add(PORT_ALERTS[f.kind], match, s, e, cause)
        if f.kind == "ib_link_down":
            for job_id in f.jobs_hit:
                job = self.jobs[job_id]
                if job.kind == "training" and len({g.node for g in job.gpus}) >= 2:
                    self.add(COMMUNICATION_STALL, {"job_id": job_id, "signature": "spinning"}, s, e, cause)
        elif f.kind == "ib_link_flap":
            rule = self.rules[IB_LINK_FLAPPING]
            limit, count = int(rule.threshold("flaps_max")), f.count or 3
            gap = (e - s) / count
            required = count > limit and limit * gap < rule.threshold("window_s")
            self.out += [Expected(IB_LINK_FLAPPING, port, s, e, required, cause) for port in self.ports(f)]
        elif f.kind == "host_cpu_contention":  # its cgroup at its CPU limit on each of its nodes
            self.add(JOB_INPUT_BOUND, {"job_id": str(f.job)}, s, e, cause)
            for name in dict.fromkeys(g.node for g in self.jobs[str(f.job)].gpus):
                self.add(HOST_CPU_CONTENTION, {"node": name}, s, e, cause)
        elif f.kind == "host_memory_pressure":
            hosts = [f.node] if f.node else dict.fromkeys(g.node for g in self.jobs[str(f.job)].gpus)
            for name in hosts:
                self.add(HOST_MEMORY_PRESSURE, {"node": str(name)}, s, e, cause)
            for job_id in [str(f.job)] if f.job else f.jobs_hit:
                self.add(JOB_INPUT_BOUND, {"job_id": job_id}, s, e, cause)
                if self.jobs[job_id].kind != "training":  # an inference server or notebook may never have been busy
                    self.out[-1] = replace(self.out[-1], required=False)

    def memory_leak(self, f: FaultSpec, cause: str) -> None:
        """The leak climbs linearly to LEAK_TARGET_SHARE over 90% of its window; it saturates once it passes 95%."""
        assert f.gpu is not None
        model = self.nodes[f.gpu.node].model
        base = max((j.memory_fraction for j in self.scenario.jobs if f.gpu in j.gpus and j.running(f.start)), default=0)
        usable = (model.memory_total_bytes - model.memory_reserved_bytes) / model.memory_total_bytes - 0.002
        target = max(base, min(LEAK_TARGET_SHARE, usable))
        if target < MEMORY_RATIO:
            return
        share = (MEMORY_RATIO - base) / (target - base) if target > base else 0.0
        crossing = f.start + max(0.0, share) * 0.9 * (f.end - f.start)
        self.add(MEMORY_SATURATED, _gpu(f.gpu), crossing - 2 * self.step, f.end, cause)

    def power_cap(self, f: FaultSpec, cause: str) -> None:
        """A capped GPU shows the cap only while its work asks for more than the lower limit."""
        assert f.gpu is not None
        kinds = self.jobs_on(f.gpu, f.start)
        if not kinds:
            return  # an idle GPU only shows the lower limit
        self.add(POWER_CAPPED, _gpu(f.gpu), f.start, f.end, cause)
        if not all(k in ("training", "inference") for k in kinds):
            self.out[-1] = Expected(POWER_CAPPED, _gpu(f.gpu), f.start, f.end, False, cause)

    def idle_jobs(self) -> None:
        for job in self.scenario.jobs:
            # Any job may idle long enough (a long hang, a slow start) for JobInefficient; it need not.
            self.out.append(Expected(JOB_INEFFICIENT, {"job_id": job.id}, job.start, job.end, False, f"job {job.id}"))
            if job.kind == "idle":
                for ref in job.gpus:
                    self.add(IDLE_ALLOCATED, {**_gpu(ref), "job_id": job.id}, job.start, job.end, f"idle job {job.id}")


def expected_alerts(scenario: Scenario, rules: Sequence[AlertRule]) -> list[Expected]:
    """The alerts the scenario's faults (and idle jobs) call for."""
    ex = _Expectations(scenario, {r.name: r for r in rules})
    for fault in scenario.faults:
        ex.fault(fault)
    ex.idle_jobs()
    return ex.out


def score(name: str, expected: list[Expected], fired: list[FiredAlert], step_s: float) -> Outcome:
    outcome = Outcome(name, expected, fired)
    for alert in sorted(fired, key=lambda a: a.starts_at):
        matches = [i for i, e in enumerate(expected) if e.accepts(alert, 2 * step_s)]
        if not matches:
            outcome.false_alerts.append(alert)
            continue
        fresh = [i for i in matches if i not in outcome.detected]
        for i in fresh:
            outcome.detected[i] = alert
        if not fresh:
            outcome.refired.append(alert)
    return outcome


def run(text: str, name: str, rules: Sequence[AlertRule] | None = None) -> Outcome:
    """Replay a scenario through the builtin rules (or ``rules``) and score it."""
    scenario = parse_scenario(text, source=name)
    rules = list(rules) if rules is not None else builtin_rules()
    began = time.perf_counter()
    report = replay(SimCluster(scenario), start=scenario.start, end=scenario.end, step_s=scenario.step_s, rules=rules)
    seconds = time.perf_counter() - began
    outcome = score(name, expected_alerts(scenario, rules), report.alerts, scenario.step_s)
    outcome.seconds = seconds
    outcome.rounds = report.rounds
    outcome.causes = {f"{f.kind} #{f.index}": f.kind for f in scenario.faults}
    outcome.causes.update({f"idle job {j.id}": "idle job" for j in scenario.jobs if j.kind == "idle"})
    return outcome


def bound_s(alertname: str, rules: Sequence[AlertRule], step_s: float) -> float:
    """The detection bound: the rule's ``for`` plus two scrape intervals."""
    rule = next(r for r in rules if r.name == alertname)
    return rule.for_s + 2 * step_s


@dataclass
class KindTally:
    """Faults of one kind over many outcomes: injected, those that call for an alert, those whose alerts all fired."""

    injected: int = 0
    alerting: int = 0
    detected: int = 0


@dataclass
class RuleTally:
    """One rule over many outcomes: the (alert, subject) pairs required, those that fired, and false alerts."""

    required: int = 0
    detected: int = 0
    fired: int = 0
    false: int = 0


def _base_cause(cause: str) -> str:
    return cause.split(" (")[0]


def tally(outcomes: Sequence[Outcome]) -> tuple[dict[str, KindTally], dict[str, RuleTally]]:
    """Per fault kind: a fault is detected when every alert it requires fired; per rule: alerts required,
    detected, fired in all and false."""
    kinds: dict[str, KindTally] = {}
    rules: dict[str, RuleTally] = {}
    for o in outcomes:
        needs: dict[str, list[int]] = {}
        for i, e in enumerate(o.expected):
            if e.required:
                needs.setdefault(_base_cause(e.cause), []).append(i)
                rules.setdefault(e.alertname, RuleTally()).required += 1
                if i in o.detected:
                    rules[e.alertname].detected += 1
        for cause, kind in o.causes.items():
            k = kinds.setdefault(kind, KindTally())
            k.injected += 1
            if cause in needs:
                k.alerting += 1
                k.detected += all(i in o.detected for i in needs[cause])
        for alert in o.fired:
            rules.setdefault(alert.alertname, RuleTally()).fired += 1
        for alert in o.false_alerts:
            rules[alert.alertname].false += 1
    return kinds, rules
