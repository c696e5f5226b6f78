"""The fabric rules: each InfiniBand/RoCE port's state, rate, errors, congestion and saturation, tied to GPUs and jobs.

Each check is a pure function of a rule, the history and ``now`` (like ``alerts.checks``) over the latest round's
ports (``History.fabric``). A port alert is labelled with its ``node``, ``device``, ``port``, the ``gpus`` next to it
and the ``job`` (and ``job_id``) holding them, and its summary names all of them. ``fabric_evidence`` tells the stall
detector what a job's ports show.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from operator import attrgetter
from typing import Final

from gpulens.alerts.base import AlertRule, Candidate, percent, rate_text, rule_labels
from gpulens.alerts.fabrichistory import FabricWindow, PortState
from gpulens.alerts.history import History
from gpulens.config import format_duration
from gpulens.fabricmodel import NicReading

PHYS_STATE_DISABLED: Final = "Disabled"


def gpus_text(gpus: Sequence[int]) -> str:
    """``4-5``, ``0-2,6``: GPU indices the way a person writes them."""
    out: list[str] = []
    ordered = sorted(set(gpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def port_name(nic: NicReading, always: bool = False) -> str:
    """``node-03 mlx5_2`` (``port 2`` added for a port other than 1, or ``always``)."""
    return f"{nic.node} {nic.device}" + (f" port {nic.port}" if always or nic.port != 1 else "")


def port_place(nic: NicReading, jobs: Sequence[str], always: bool = True) -> str:
    """``node-03 mlx5_2 port 1 (GPUs 4-5, job llm)``: the port, its GPUs and the jobs holding them."""
    parts = []
    if nic.gpus:
        parts.append(f"GPU{'s' if len(nic.gpus) > 1 else ''} {gpus_text(nic.gpus)}")
    if jobs:
        parts.append(f"job{'s' if len(jobs) > 1 else ''} {', '.join(jobs)}")
    return port_name(nic, always) + (f" ({', '.join(parts)})" if parts else "")


def clock_text(t: float) -> str:
    """``12:03 UTC``: a time of day the way an alert states it."""
    return time.strftime("%H:%M UTC", time.gmtime(t))


def layer_text(nic: NicReading) -> str:
    return "RoCE" if nic.is_roce else "InfiniBand"


def _ports(history: History) -> Sequence[tuple[NicReading, PortState]]:
    """The latest round's ports, each with what the history keeps of it."""
    return history.fabric.ports()


def _candidate(
    rule: AlertRule, history: History, nic: NicReading, value: float | None, what: str, description: str
) -> Candidate:
    jobs = history.fabric.port_jobs(nic)
    subject = {
        "node": nic.node,
        "device": nic.device,
        "port": str(nic.port),
        "gpus": gpus_text(nic.gpus),
        "job": ",".join(jobs),
        "job_id": ",".join(jobs),
    }
    labels = rule_labels(rule, subject)
    return Candidate(rule.name, labels, value, f"{port_place(nic, jobs)}: {what}", description)


# ------------------------------------------------------------------------------------------------ state


def link_down_since(fabric: FabricWindow, nic: NicReading) -> float | None:
    """When the port went down, if it is down and counts as a fault (it was up, or has gone down before); else
    ``None``. A port disabled on purpose never counts."""
    if nic.up or nic.phys_state == PHYS_STATE_DISABLED:
        return None
    return _down_since(nic, fabric.port(nic.key))


def _down_since(nic: NicReading, port: PortState | None) -> float | None:
    """``link_down_since`` of a port that is down and not disabled, from its state."""
    if port is not None and port.down_since is not None:
        return port.down_since
    if nic.link_downed_total:
        return port.series[0][0] if port is not None and port.series else None
    return None


def ib_link_down(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    out = []
    for nic, port in _ports(history):
        if nic.up or nic.phys_state == PHYS_STATE_DISABLED:
            continue
        since = _down_since(nic, port)
        if since is None:
            continue
        jobs = history.fabric.port_jobs(nic)
        state = ", ".join(s for s in (nic.state, nic.phys_state) if s) or "state unknown"
        downs = "unknown" if nic.link_downed_total is None else str(nic.link_downed_total)
        what = f"{layer_text(nic)} link down since {clock_text(since)} ({state})"
        description = (
            f"The port reads {state}; it was up before. "
            + (f"Job {', '.join(jobs)} loses this rail: its collectives across nodes stall. " if jobs else "")
            + f"Link-down events counted by the port: {downs}."
        )
        out.append(_candidate(rule, history, nic, now - since, what, description))
    return out


def flaps(fabric: FabricWindow, nic: NicReading, since: float) -> int:
    """How often the port went down from ``since`` on: its link_downed counter's rise, or the down rounds seen."""
    counted = fabric.increase(nic.key, since, lambda n: n.link_downed_total)
    if nic.link_downed_total is not None and counted is not None:
        return int(counted)
    return fabric.down_rounds(nic.key, since)


def ib_link_flapping(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    window = rule.threshold("window_s")
    limit = rule.threshold("flaps_max")
    out = []
    for nic, port in history.fabric.ports_moved():  # every other port: its counter the same at both ends
        series = port.series
        if nic.link_downed_total is not None and len(series) >= 2:
            last = series[-1][1].link_downed_total
            if last is not None and series[0][1].link_downed_total == last:
                continue  # the counter did not move in the window: no flap (``flaps`` finds 0)
        count = flaps(history.fabric, nic, now - window)
        if count <= limit:
            continue
        state = "up now" if nic.up else "down now"
        what = f"{layer_text(nic)} link went down {count} times in the last {format_duration(window)} ({state})"
        description = (
            f"The port's link went down {count} times within {format_duration(window)} (more than "
            f"{limit:g}): each time the collectives crossing it stall."
        )
        out.append(_candidate(rule, history, nic, float(count), what, description))
    return out


# ------------------------------------------------------------------------------------------------ rate


def ib_link_degraded(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    ratio = rule.threshold("peer_rate_ratio")
    bounded = ratio >= 0  # ratio * median <= ratio * largest: the shortcut below holds
    fabric = history.fabric
    out = []
    for nic, memory in _ports(history):
        rate = nic.rate_bytes_per_second
        if not nic.up or not rate:
            continue
        problems, ceiling = [], rate
        if nic.link_width and memory.best_width and nic.link_width < memory.best_width:
            problems.append(f"{nic.link_width}x lanes instead of {memory.best_width}x")
        if memory.best_rate and rate < memory.best_rate:
            problems.append(f"{rate_text(rate)} instead of its {rate_text(memory.best_rate)}")
            ceiling = memory.best_rate
        # The peers' median is at most the largest rate of the node's up ports of the layer (this port's group, set
        # this round since it is up with a rate): at or above ``ratio`` of that, the port cannot be below ``ratio`` of
        # the median, and the median (a search per port) is not needed. Most ports run at their node's rate.
        group = memory.peers
        peers = None if bounded and group is not None and rate >= ratio * group.top else fabric.peer_rate(nic)
        if peers and rate < ratio * peers:
            problems.append(f"{percent(rate / peers)} of its peers' {rate_text(peers)}")
            ceiling = max(ceiling, peers)
        if not problems:
            continue
        what = f"{layer_text(nic)} link degraded: {'; '.join(problems)}"
        speed = f" ({nic.link_width}x {nic.link_speed})" if nic.link_width and nic.link_speed else ""
        description = (
            f"The port is up at {rate_text(rate)}{speed}, below its maximum of {rate_text(ceiling)}: every "
            "collective crossing it runs at its pace."
        )
        out.append(_candidate(rule, history, nic, rate / ceiling, what, description))
    return out


# ------------------------------------------------------------------------------------------------ errors

_ERRORS: Final = (
    ("symbol errors", "symbol_errors_max", lambda n: n.symbol_errors_total),
    ("link integrity errors", "link_integrity_errors_max", lambda n: n.local_link_integrity_errors_total),
    ("receive errors", "receive_errors_max", lambda n: n.receive_errors_total),
)


_ERROR_COUNTERS: Final = attrgetter(
    "symbol_errors_total", "local_link_integrity_errors_total", "receive_errors_total"
)  # the counters of _ERRORS, read at once


def ib_errors(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    window = rule.threshold("window_s")
    out = []
    for nic, port in history.fabric.ports_moved():  # every other port: its counters the same at both ends
        series = port.series
        if len(series) >= 2:
            first = _ERROR_COUNTERS(series[0][1])
            if None not in first and first == _ERROR_COUNTERS(series[-1][1]):
                continue  # most ports: no error counter moved in the whole window (``FabricWindow.unchanged``)
        found: dict[str, float] = {}
        over = False
        for name, limit, get in _ERRORS:
            rise = history.fabric.increase(nic.key, now - window, get)
            if rise:
                found[name] = rise
                over = over or rise > rule.threshold(limit)
        if not over:
            continue
        parts = [f"{count:.0f} {name}" for name, count in found.items()]
        what = f"{layer_text(nic)} errors: {', '.join(parts)} in the last {format_duration(window)}"
        description = (
            f"Physical-layer errors on the port within {format_duration(window)}: {', '.join(parts)}. A link with "
            "climbing errors retransmits, and is the next to flap or go down."
        )
        out.append(_candidate(rule, history, nic, sum(found.values()), what, description))
    return out


# ------------------------------------------------------------------------------------------------ traffic


def _traffic(nic: NicReading) -> float | None:
    present = [v for v in (nic.transmit_bytes_per_second, nic.receive_bytes_per_second) if v is not None]
    return max(present) if present else None


def fabric_congestion(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    traffic_ratio_max = rule.threshold("traffic_ratio_max")
    wait_min, cnp_min = rule.threshold("wait_min_per_second"), rule.threshold("cnp_min_per_second")
    out = []
    for nic, port in _ports(history):
        wait, cnp = nic.transmit_wait_per_second, nic.cnp_handled_per_second
        if (wait is None or wait < wait_min) and (cnp is None or cnp < cnp_min):
            continue  # the floors first: most ports are nowhere near them, and a baseline costs a median
        rate, traffic = nic.rate_bytes_per_second, _traffic(nic)
        if not nic.up or not rate or traffic is None or traffic >= traffic_ratio_max * rate:
            continue
        base = port.baseline()
        signs = []
        for name, now_value, usual, ratio, floor in (
            ("transmit wait", wait, base.wait, "wait_ratio", "wait_min_per_second"),
            ("CNPs handled", cnp, base.cnp, "cnp_ratio", "cnp_min_per_second"),
        ):
            if now_value is None or usual is None:
                continue
            if now_value >= rule.threshold(floor) and now_value >= rule.threshold(ratio) * usual:
                times = f"{now_value / usual:.0f}x" if usual > 0 else "far above"
                signs.append(f"{name} {now_value:.3g}/s, {times} its usual {usual:.3g}/s")
        if not signs:
            continue
        load = f"traffic {rate_text(traffic)} ({percent(traffic / rate)} of rate)"
        what = f"fabric congestion: {'; '.join(signs)}, {load}"
        description = (
            f"The port waits to send far more than usual ({'; '.join(signs)}) while it moves only "
            f"{rate_text(traffic)} of its {rate_text(rate)}: the fabric beyond it is congested."
        )
        out.append(_candidate(rule, history, nic, traffic / rate, what, description))
    return out


def fabric_saturated(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    share = rule.threshold("utilization_ratio")
    out = []
    for nic, port in _ports(history):
        rate = nic.rate_bytes_per_second
        if not nic.up or not rate:
            continue
        tx, rx = nic.transmit_bytes_per_second, nic.receive_bytes_per_second
        if tx is None and rx is None:
            continue
        best = port.best_rate
        if best and rate < best:
            continue  # degraded: its lower ceiling is IbLinkDegraded's to report
        if tx is None or (rx is not None and rx > tx):  # the busier direction, TX on a tie (as ``max`` picks)
            assert rx is not None
            name, value = "RX", rx
        else:
            name, value = "TX", tx
        if value < share * rate:
            continue
        what = f"{layer_text(nic)} {name} at {rate_text(value)}, {percent(value / rate)} of its {rate_text(rate)}"
        description = f"{layer_text(nic)} {name} throughput {rate_text(value)} against a port rate of {rate_text(rate)}"
        description += "; sustained, the inter-node link is the bottleneck."
        out.append(_candidate(rule, history, nic, value / rate, what, description))
    return out


# ------------------------------------------------------------------------------------------------ for the stall


def fabric_evidence(
    history: History, gpus: Mapping[str, Sequence[int]], window_s: float, now: float
) -> tuple[str | None, str]:
    """What a multi-node job's ports show: (a fault worth the summary or ``None``, a sentence for the description).

    ``gpus`` holds the job's GPU indices by node; its ports are those next to them.
    """
    fabric = history.fabric
    nics = fabric.job_nics(gpus)
    if not nics:
        return None, ""
    faults = []
    for nic in nics:
        place = port_place(nic, (), always=False)
        since = link_down_since(fabric, nic)
        count = flaps(fabric, nic, now - window_s)
        if since is not None and count > 1:
            faults.append(f"{place} went down {count} times in the last {format_duration(window_s)}, down now")
        elif since is not None:
            faults.append(f"{place} is down since {clock_text(since)}")
        elif count:
            times = "once" if count == 1 else f"{count} times"
            faults.append(f"{place} went down {times} in the last {format_duration(window_s)}")
    traffic = sum(_traffic(n) or 0.0 for n in nics)
    up = sum(1 for n in nics if n.up)
    seen = f"The job's {len(nics)} NICs: {up} up, {rate_text(traffic)} in all."
    if faults:
        shown = faults[0] if len(faults) == 1 else f"{faults[0]}; {len(faults) - 1} more of its NICs down or flapping"
        return shown, f"{seen} {'; '.join(faults)}."
    return None, seen
