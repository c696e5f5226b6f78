"""The simulated fabric: each node's RDMA ports, the traffic its jobs move over them step by step, and their readings.

A training job spanning nodes moves traffic on the ports next to its GPUs while it communicates: a share of the
port's rate that peaks at 30-60 % (fixed per job) during all-reduce, so a step's average follows the job's
all-reduce share; a job on one node moves none. A training job's checkpoint is written over the ports next to its
GPUs (network storage) while its GPUs idle. Fabric fault kinds (``gpulens.exporter.sim.faults``) adjust a port's state
(down, degraded, congested) and add to its error counters; faults that hit a job (a stall, a slow-down, a starved
input pipeline) act through the job's phase and its ``fabric_pace``.

Ports alike (same rate and layer, same jobs on their GPUs, same faults) share a :class:`PortContext` and its
running sums of traffic, transmit wait and congestion notifications; each port scales them by its own fixed weight
(within 2 %), so ``*_total`` counters and ``*_per_second`` rates always agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from gpulens.exporter.sim import noise
from gpulens.exporter.sim.behaviour import JobBehaviour
from gpulens.exporter.sim.faults import FAULT_KINDS
from gpulens.exporter.sim.ledger import RateLedger
from gpulens.exporter.sim.specs import FaultSpec, JobSpec, NicSpec, NodeSpec, Scenario
from gpulens.exporter.sim.stepstate import (
    CHECKPOINT,
    CHECKPOINT_WRITE,
    EVAL,
    RUN,
    STARVED,
    JobPhase,
    PortCounters,
    PortState,
)
from gpulens.fabricmodel import LINK_LAYER_ETHERNET, PORT_PHYS_STATE_LINK_UP, PORT_STATE_ACTIVE, NicReading

PEAK_SHARE_MIN: Final = 0.30  # of the port's rate while a job spanning nodes is in all-reduce
PEAK_SHARE_SPREAD: Final = 0.30
EVAL_SHARE: Final = 0.01  # of the peak: a metric all-reduce now and then
CHECKPOINT_SHARE: Final = 0.45  # of the port's rate, written to network storage
CHECKPOINT_READ_SHARE: Final = 0.004
CEILING: Final = 0.95  # the most of its (current) rate a port moves, before its weight (so at most ~97 %)
WAIT_TICKS_PER_S: Final = 2_000.0  # transmit wait at full rate on a healthy fabric
CONGESTED_WAIT_TICKS_PER_S: Final = 4_000_000.0
CNP_PER_S: Final = 20.0  # RoCE congestion notifications at full rate on a healthy fabric
CONGESTED_CNP_PER_S: Final = 60_000.0
CNP_SENT_SHARE: Final = 0.6  # of those handled: what the port's own receive side sends back
BYTES_PER_PACKET: Final = 4096  # the IB MTU's payload; RoCE at MTU 4200 carries the same
JITTER: Final = 0.03  # step to step
WEIGHT_SPREAD: Final = 0.02  # port to port, fixed
AT_CEILING_JITTER: Final = 0.01

# One step's rates (per second, before a port's weight): transmit and receive bytes, transmit wait, CNPs handled.
Rates = tuple[float, float, float, float]
PhaseOf = Callable[[str, int], JobPhase | None]


@dataclass(frozen=True, slots=True)
class PortJob:
    """A job on a port's GPUs: its share of them and whether it spans nodes (only then does it use the fabric)."""

    job: JobSpec
    held: float  # the job's GPUs among the port's, as a share
    spans: bool
    peak: float  # share of the port's rate while the job is in all-reduce


@dataclass(slots=True, eq=False)
class PortContext:
    """What shapes a port's traffic; ports alike share one, and its running sums."""

    rate_bytes_per_second: float
    roce: bool
    jobs: tuple[PortJob, ...]
    faults: tuple[FaultSpec, ...]  # acting on the port itself
    key: bytes
    ledger: RateLedger = field(init=False)


@dataclass(slots=True, eq=False)
class SimPort:
    """One port of one node: its spec, its context and its fixed quirks."""

    node: str
    spec: NicSpec
    context: PortContext
    weight: float
    base_bytes: tuple[int, int]  # traffic moved before the scenario began (uptime), transmit and receive
    base_wait: int
    base_symbol_errors: int
    base_link_downed: int
    idle: NicReading | None = None  # a port with nothing to move and no faults reads the same every step


def _jittered(share: float, ceiling: float, u: float) -> float:
    """A share of the port's rate with noise, at most ``ceiling`` (a port at its ceiling wavers just under it)."""
    if share >= ceiling:
        return ceiling * (1.0 - AT_CEILING_JITTER * u)
    return min(ceiling, share * (1.0 + noise.spread(u, JITTER)))


HEALTHY: Final = PortState()  # shared by every port without faults: never adjusted
NO_ERRORS: Final = PortCounters()


def port_state(faults: tuple[FaultSpec, ...], t: float) -> PortState:
    """A port's state during the step at ``t``: healthy, adjusted by each fault acting on it then."""
    state = PortState()
    for fault in faults:
        if fault.active(t):
            FAULT_KINDS[fault.kind].port(fault, t, state)
    return state


def port_counters(faults: tuple[FaultSpec, ...], t: float, counter_scale: float) -> PortCounters:
    """What the port's faults have added to its error counters by ``t`` (they keep their values once over)."""
    counters = PortCounters()
    for fault in faults:
        if t >= fault.start:
            elapsed = (min(t, fault.end) - fault.start) * counter_scale
            FAULT_KINDS[fault.kind].port_count(fault, t, elapsed, counters)
    return counters


class Fabric:
    """Every port of a scenario's nodes, with the running sums their counters are built from."""

    def __init__(
        self,
        scenario: Scenario,
        behaviours: dict[str, JobBehaviour],
        phase_of: PhaseOf,
        counter_scale: float,
    ) -> None:
        self._scenario = scenario
        self._behaviours = behaviours
        self._phase_of = phase_of
        self._scale = counter_scale
        self._step = scenario.step_s
        self._last_step = math.ceil(scenario.duration_s / scenario.step_s) + 1
        self._contexts: dict[tuple[object, ...], PortContext] = {}
        self._jobs = {j.id: j for j in scenario.jobs}
        self._peaks = {
            j.id: PEAK_SHARE_MIN + PEAK_SHARE_SPREAD * noise.unit(scenario.seed, "fabric", j.id) for j in scenario.jobs
        }
        self._by_node: dict[str, list[JobSpec]] = {}
        self._spans = {j.id: len({g.node for g in j.gpus}) >= 2 for j in scenario.jobs}
        for job in scenario.jobs:
            for node in dict.fromkeys(g.node for g in job.gpus):
                self._by_node.setdefault(node, []).append(job)
        self.ports: dict[str, list[SimPort]] = {n.name: [self._port(n, nic) for nic in n.nics] for n in scenario.nodes}

    # ------------------------------------------------------------------------------------------ set-up

    def _port(self, node: NodeSpec, nic: NicSpec) -> SimPort:
        seed = self._scenario.seed
        u = noise.draw(noise.key(seed, "port", node.name, nic.device), 0)
        return SimPort(
            node=node.name,
            spec=nic,
            context=self._context(node, nic),
            weight=1.0 + noise.spread(u[0], WEIGHT_SPREAD),
            base_bytes=(int(u[1] * 4e14), int(u[2] * 4e14)),
            base_wait=int(u[3] * 5e6),
            base_symbol_errors=int(8 * u[4]) if u[5] < 0.1 else 0,
            base_link_downed=1 if u[6] < 0.05 else 0,
        )

    def _context(self, node: NodeSpec, nic: NicSpec) -> PortContext:
        jobs: list[PortJob] = []
        for job in self._by_node.get(node.name, []):
            if job.kind != "training" or not (self._spans[job.id] or job.checkpoint_every_s is not None):
                continue  # it never uses the fabric
            held = sum(1 for g in job.gpus if g.node == node.name and g.index in nic.gpus)
            if held:
                jobs.append(PortJob(job, held / len(nic.gpus), self._spans[job.id], self._peaks[job.id]))
        faults = tuple(f for f in self._scenario.faults if self._acts_on(f, node.name, nic))
        roce = nic.link_layer == LINK_LAYER_ETHERNET
        key = (
            nic.rate_bytes_per_second,
            roce,
            tuple((p.job.id, p.held) for p in jobs),
            tuple(f.index for f in faults),
        )
        known = self._contexts.get(key)
        if known is not None:
            return known
        ctx = PortContext(
            nic.rate_bytes_per_second, roce, tuple(jobs), faults, noise.key(self._scenario.seed, "ports", key)
        )
        static = not jobs and not faults
        ctx.ledger = RateLedger(lambda k: self._rates(ctx, k), 4, 0 if static else self._last_step, self._step)
        self._contexts[key] = ctx
        return ctx

    def _acts_on(self, fault: FaultSpec, node: str, nic: NicSpec) -> bool:
        """Whether a fault acts on this port: it names it, or it names a job with GPUs next to it."""
        kind = FAULT_KINDS[fault.kind]
        if not kind.fabric or kind.target != "nic":
            return False
        if fault.nic is not None:
            return fault.node == node and fault.nic == nic.device
        job = self._jobs.get(fault.job or "")
        return job is not None and any(g.node == node and g.index in nic.gpus for g in job.gpus)

    # ------------------------------------------------------------------------------------------ per step

    def _pace(self, job: JobSpec, t: float) -> float:
        pace = 1.0
        for fault in self._behaviours[job.id].faults:
            if fault.active(t):
                pace *= FAULT_KINDS[fault.kind].fabric_pace(fault, t)
        return pace

    def _rates(self, ctx: PortContext, k: int) -> Rates:
        """A port's nominal rates during step ``k`` (per second, before its weight)."""
        t = self._scenario.start + k * self._step
        state = port_state(ctx.faults, t) if ctx.faults else PortState()
        if not state.up:
            return (0.0, 0.0, 0.0, 0.0)
        tx = rx = 0.0
        for place in ctx.jobs:
            phase = self._phase_of(place.job.id, k)
            if phase is None:
                continue
            mode = phase.mode
            if mode in (RUN, STARVED) and place.spans:
                share = place.peak * phase.comm_fraction * self._pace(place.job, t)
                tx += share * place.held
                rx += share * place.held
            elif mode == EVAL and place.spans:
                tx += EVAL_SHARE * place.peak * place.held
                rx += EVAL_SHARE * place.peak * place.held
            elif mode in (CHECKPOINT, CHECKPOINT_WRITE):
                tx += CHECKPOINT_SHARE * place.held
                rx += CHECKPOINT_READ_SHARE * place.held
        ceiling = CEILING * state.rate_share
        u = noise.draw(ctx.key, k) if tx or rx or state.congested else None
        tx_share = _jittered(tx, ceiling, u[0]) if u else 0.0
        rx_share = _jittered(rx, ceiling, u[1]) if u else 0.0
        busy = max(tx_share, rx_share)
        if state.congested:
            assert u is not None
            wait = CONGESTED_WAIT_TICKS_PER_S * (0.85 + 0.3 * u[2])
            cnp = CONGESTED_CNP_PER_S * (0.85 + 0.3 * u[3]) if ctx.roce else 0.0
        else:
            wait = WAIT_TICKS_PER_S * busy * (1.0 + noise.spread(u[2], 0.2)) if u else 0.0
            cnp = CNP_PER_S * busy * (1.0 + noise.spread(u[3], 0.2)) if u and ctx.roce else 0.0
        rate = ctx.rate_bytes_per_second
        return (tx_share * rate, rx_share * rate, wait, cnp)

    def readings(self, node: str, k: int, t: float) -> tuple[NicReading, ...]:
        """The node's ports at step ``k`` (virtual time ``t``)."""
        return tuple(self._reading(port, k, t) for port in self.ports.get(node, ()))

    def _reading(self, port: SimPort, k: int, t: float) -> NicReading:
        if port.idle is not None:
            return port.idle
        ctx = port.context
        spec = port.spec
        faults = ctx.faults
        state = port_state(faults, t) if faults else HEALTHY
        errors = port_counters(faults, t, self._scale) if faults else NO_ERRORS
        w = port.weight
        scale = w * self._scale
        (tx, rx, wait, cnp), (tx_sum, rx_sum, wait_sum, cnp_sum) = ctx.ledger.at(k)
        tx_total = port.base_bytes[0] + int(tx_sum * scale)
        rx_total = port.base_bytes[1] + int(rx_sum * scale)
        roce = ctx.roce
        reading = NicReading(
            node=port.node,
            device=spec.device,
            port=spec.port,
            link_layer=spec.link_layer,
            state=state.state,
            phys_state=state.phys_state,
            up=state.up and state.state == PORT_STATE_ACTIVE and state.phys_state == PORT_PHYS_STATE_LINK_UP,
            rate_bytes_per_second=spec.rate_bytes_per_second * state.rate_share,
            link_width=spec.link_width if state.link_width is None else state.link_width,
            link_speed=spec.link_speed,
            transmit_bytes_total=tx_total,
            receive_bytes_total=rx_total,
            transmit_packets_total=tx_total // BYTES_PER_PACKET,
            receive_packets_total=rx_total // BYTES_PER_PACKET,
            transmit_wait_total=port.base_wait + int(wait_sum * scale),
            symbol_errors_total=port.base_symbol_errors + errors.symbol_errors,
            link_downed_total=port.base_link_downed + errors.link_downed,
            link_error_recovery_total=port.base_link_downed + errors.link_error_recovery,
            receive_errors_total=errors.receive_errors,
            local_link_integrity_errors_total=errors.local_link_integrity_errors,
            excessive_buffer_overrun_errors_total=0,
            transmit_discards_total=0,
            cnp_sent_total=int(cnp_sum * scale * CNP_SENT_SHARE) if roce else None,
            cnp_handled_total=int(cnp_sum * scale) if roce else None,
            out_of_sequence_total=0 if roce else None,
            packet_sequence_errors_total=0 if roce else None,
            local_ack_timeouts_total=0 if roce else None,
            transmit_bytes_per_second=round(tx * w, 1),
            receive_bytes_per_second=round(rx * w, 1),
            transmit_wait_per_second=round(wait * w, 1),
            cnp_handled_per_second=round(cnp * w, 2) if roce else None,
            pci_bus_id=spec.pci_bus_id,
            numa_node=spec.numa_node,
            gpus=spec.gpus,
        )
        if not faults and not ctx.jobs:  # nothing will ever change on it
            port.idle = reading
        return reading
