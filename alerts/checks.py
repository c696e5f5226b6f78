"""The per-GPU and per-node builtin rules: saturation, throttling, hardware errors, lost GPUs and exporters.

Each check is a pure function of a rule, the history and ``now`` that returns the candidates whose condition holds in
the latest round. Link maxima come from each reading's own fields (maximum PCIe generation and width, active NVLink
links). A reading without a power limit (dcgm-exporter's default counters have none) is judged against its model's
board power (``gpulens.hardware``), and its alert says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any, Final

from gpulens.alerts.base import (
    AlertRule,
    Candidate,
    gpu_name,
    gpu_subject,
    job_suffix,
    percent,
    rate_text,
    reasons_source_text,
    rule_labels,
)
from gpulens.alerts.history import History, Round
from gpulens.alerts.names import XID_MEANINGS
from gpulens.config import format_duration
from gpulens.hardware import find_gpu_model, pcie_max_bytes_per_second
from gpulens.httpfetch import redact_url
from gpulens.model import THROTTLE_REASONS, GpuJob, GpuReading, throttle_reason_names
from gpulens.xidcatalogue import XID_BY_CODE, xid_action

_BIT: Final = dict(THROTTLE_REASONS)
THERMAL_BITS: Final = _BIT["sw_thermal"] | _BIT["hw_thermal"]
HW_SLOWDOWN: Final = _BIT["hw_slowdown"]
HW_POWER_BRAKE_BIT: Final = _BIT["hw_power_brake"]
SW_POWER_CAP: Final = _BIT["sw_power_cap"]
_GIB: Final = float(1 << 30)


def _xid_gpus(history: History) -> Sequence[tuple[GpuReading, Sequence[GpuJob]]]:
    """The latest round's GPUs with XID counts, lost ones included (the kernel log counts a lost GPU's XID 79)."""
    latest = history.latest
    if latest is None:
        return ()
    jobs = latest.gpu_jobs
    return [(r, jobs.get(uuid, ())) for uuid, r in latest.gpus.items() if r.xid_errors]


def _candidate(
    rule: AlertRule,
    reading: GpuReading,
    jobs: Sequence[GpuJob],
    value: float | None,
    what: str,
    description: str,
    extra: Mapping[str, str] | None = None,
) -> Candidate:
    labels = rule_labels(rule, {**gpu_subject(reading, jobs), **(extra or {})})
    summary = f"GPU {gpu_name(labels)}{job_suffix(labels)}: {what}"
    return Candidate(rule.name, labels, value, summary, description)


def _clock_text(reading: GpuReading) -> str:
    model = find_gpu_model(reading.model) if not reading.max_sm_clock_hertz else None
    top = reading.max_sm_clock_hertz or (model.max_sm_clock_hertz if model else None)
    if reading.sm_clock_hertz and top:
        return f", SM clock {percent(reading.sm_clock_hertz / top)} of max"
    return ""


# ------------------------------------------------------------------------------------------------ saturation


def memory_saturated(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    limit = rule.threshold("used_ratio")
    cols = history.columns()  # the test below, first over the columns: the cheapest pass over every GPU
    out = []
    memory = cols.zip("memory_used_bytes", "memory_total_bytes")
    for reading, jobs in cols.where(u is not None and t and u / t >= limit for u, t in memory):
        used, total = reading.memory_used_bytes, reading.memory_total_bytes
        if used is None or not total:
            continue
        ratio = used / total
        if ratio >= limit:
            what = f"memory {percent(ratio)} full ({used / _GIB:.1f} of {total / _GIB:.1f} GiB)"
            description = (
                f"{used / _GIB:.1f} GiB of {total / _GIB:.1f} GiB in use, at or above {percent(limit)}; the next "
                "allocation may fail with out-of-memory, or a process leaks memory."
            )
            out.append(_candidate(rule, reading, jobs, ratio, what, description))
    return out


def thermal_throttling(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    margin = rule.threshold("margin_celsius")
    cols = history.columns()  # a clock reason set, or hot (the test below): the cheapest pass over every GPU
    heat = cols.zip("throttle_reasons", "temperature_celsius", "slowdown_temperature_celsius")
    out = []
    for reading, jobs in cols.where(b or (t is not None and s is not None and t >= s - margin) for b, t, s in heat):
        bits = reading.throttle_reasons or 0
        temp, slowdown = reading.temperature_celsius, reading.slowdown_temperature_celsius
        hot = temp is not None and slowdown is not None and temp >= slowdown - margin
        slowed = bool(bits & THERMAL_BITS) or bool(bits & HW_SLOWDOWN and not bits & HW_POWER_BRAKE_BIT)
        if not (hot or slowed):
            continue
        reasons = [n for n in throttle_reason_names(bits) if n in ("sw_thermal", "hw_thermal", "hw_slowdown")]
        at = f"{temp:.0f} °C" if temp is not None else "an unknown temperature"
        limit = f" (slowdown {slowdown:.0f} °C)" if slowdown is not None else ""
        source = reasons_source_text(reading) if slowed else ""
        what = f"thermal throttling at {at}{limit}" + (f": {', '.join(reasons)}{source}" if reasons else "")
        what += _clock_text(reading)
        description = (
            f"Temperature {at}{limit}; clock reasons: {', '.join(throttle_reason_names(bits)) or 'none'}{source}. "
            "The GPU lowers its clocks to cool down."
        )
        out.append(_candidate(rule, reading, jobs, temp, what, description))
    return out


def power_capped(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    share = rule.threshold("power_ratio")
    busy = rule.threshold("busy_utilization")
    cols = history.columns()  # the cap set, or a pause to hold: the two cases below
    capped = cols.zip("throttle_reasons", "utilization_ratio")
    out = []
    for reading, jobs in cols.where((b or 0) & SW_POWER_CAP or (u is not None and u < busy) for b, u in capped):
        power, limit, whose = reading.power_watts, reading.power_limit_watts, "enforced power limit"
        if not limit and (model := find_gpu_model(reading.model)) is not None:
            limit, whose = model.board_power_watts, "board power (its model's: the page has no power limit)"
        if power is None or not limit:
            continue
        if (reading.throttle_reasons or 0) & SW_POWER_CAP and power >= share * limit:
            source = reasons_source_text(reading)
            what = f"held at its {limit:.0f} W power limit (sw_power_cap{source}){_clock_text(reading)}"
            description = f"Drawing {power:.0f} W of its {limit:.0f} W {whose} with SW_POWER_CAP set{source}."
            out.append(_candidate(rule, reading, jobs, power, what, description))
        elif reading.utilization_ratio is not None and reading.utilization_ratio < busy:
            out.append(_hold(rule, reading))  # a pause in the work: the cap cannot show, nothing to judge
    return out


def _hold(rule: AlertRule, reading: GpuReading) -> Candidate:
    """Keep any alert of ``rule`` on this GPU as it is this round (see ``Candidate.hold``)."""
    return Candidate(rule.name, {"uuid": reading.uuid}, None, "", "", hold=True)


def hw_power_brake(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    out = []
    cols = history.columns()
    for reading, jobs in cols.where((b or 0) & HW_POWER_BRAKE_BIT for b in cols["throttle_reasons"]):
        what = f"hardware power brake engaged{_clock_text(reading)}"
        description = "HW_POWER_BRAKE is set: an external power signal (power supply, chassis) slows the GPU."
        out.append(_candidate(rule, reading, jobs, reading.power_watts, what, description))
    return out


def _busier(tx: float | None, rx: float | None) -> tuple[str, float]:
    """The busier direction of the two that are read (at least one is), TX on a tie."""
    if rx is None or (tx is not None and tx >= rx):
        assert tx is not None
        return "TX", tx
    return "RX", rx


def pcie_saturated(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    share = rule.threshold("utilization_ratio")
    cols = history.columns()
    links = set(cols.zip("pcie_link_generation_max", "pcie_link_width_max"))  # a cluster has few kinds
    ceilings = {link: pcie_max_bytes_per_second(*link) for link in links}
    least = share * min((c for c in ceilings.values() if c is not None), default=math.inf)  # below: no GPU fires
    rates = cols.zip("pcie_tx_bytes_per_second", "pcie_rx_bytes_per_second")
    out = []
    for reading, jobs in cols.where((t is not None and t >= least) or (r is not None and r >= least) for t, r in rates):
        tx, rx = reading.pcie_tx_bytes_per_second, reading.pcie_rx_bytes_per_second
        if tx is None and rx is None:
            continue
        gen, width = reading.pcie_link_generation_max, reading.pcie_link_width_max
        ceiling = ceilings[(gen, width)]
        if ceiling is None:
            continue
        name, rate = _busier(tx, rx)
        if rate >= share * ceiling:
            what = f"PCIe {name} at {rate_text(rate)}, {percent(rate / ceiling)} of the Gen{gen} x{width} maximum"
            description = (
                f"PCIe {name} throughput {rate_text(rate)} against a link maximum of {rate_text(ceiling)} "
                f"per direction (Gen{gen} x{width})."
            )
            out.append(_candidate(rule, reading, jobs, rate / ceiling, what, description))
    return out


def nvlink_saturated(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    share = rule.threshold("utilization_ratio")
    per_link = rule.threshold("link_bytes_per_second")
    cols = history.columns()
    rates = cols.zip("nvlink_links_active", "nvlink_tx_bytes_per_second", "nvlink_rx_bytes_per_second")
    least = share * per_link * (1 - 1e-9)  # a rate below ``least`` per active link cannot fire (rounding aside)
    out = []
    for reading, jobs in cols.where(
        n and ((t is not None and t >= least * n) or (r is not None and r >= least * n)) for n, t, r in rates
    ):
        links = reading.nvlink_links_active
        tx, rx = reading.nvlink_tx_bytes_per_second, reading.nvlink_rx_bytes_per_second
        if not links or (tx is None and rx is None):
            continue
        ceiling = links * per_link
        name, rate = _busier(tx, rx)
        if rate >= share * ceiling:
            what = (
                f"NVLink {name} at {rate_text(rate)}, {percent(rate / ceiling)} of {links} links x "
                f"{rate_text(per_link)}"
            )
            description = f"NVLink {name} throughput {rate_text(rate)} against {rate_text(ceiling)} per direction."
            out.append(_candidate(rule, reading, jobs, rate / ceiling, what, description))
    return out


# ------------------------------------------------------------------------------------------------ links and errors


def _increase(
    history: History, uuid: str, now: float, window_s: float, value: Callable[[GpuReading], float | None]
) -> tuple[float, float] | None:
    """(increase, seconds) of a counter over the window: latest minus the oldest reading in it, resets ignored."""
    oldest = history.reading_since(uuid, now - window_s)
    series = history.series(uuid)
    if oldest is None or not series:
        return None
    t_last, last = series[-1]
    start, end = value(oldest[1]), value(last)
    if start is None or end is None or t_last <= oldest[0]:
        return None
    return max(0.0, end - start), t_last - oldest[0]


# The counters each error rule compares across its window (and ``alerts.promround``, which reads a GPU whole for
# the rule only where they changed)
PCIE_REPLAYS: Final = attrgetter("pcie_replays_total")
NVLINK_ERROR_COUNTERS: Final = attrgetter(
    "nvlink_crc_flit_errors_total", "nvlink_replay_errors_total", "nvlink_recovery_errors_total"
)
ECC_UNCORRECTED: Final = attrgetter("ecc_uncorrected_errors_total")


def counters_unchanged(
    history: History, start: Round | None, reading: GpuReading, since: float, counters: Callable[[GpuReading], Any]
) -> bool:
    """Whether no counter that ``counters`` reads grew since ``since`` (``start``: the window's first round):
    ``_increase`` would find no increase in any of them (no earlier reading, an unread counter, or the same value at
    both ends). The rules test its common case (the GPU in ``start``) inline first."""
    if start is None:
        return True
    before = start.gpus.get(reading.uuid)
    if before is None:  # the GPU missed the window's first round
        oldest = history.reading_since(reading.uuid, since)
        if oldest is None:
            return True
        before = oldest[1]
    return bool(counters(before) == counters(reading))


def pcie_degraded(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    busy_util = rule.threshold("busy_utilization")
    busy_traffic = rule.threshold("busy_traffic_ratio")
    replay_limit = rule.threshold("replays_per_minute")
    window = rule.threshold("window_s")
    start = history.round_since(now - window)
    first = start.gpus if start is not None else {}  # the window's first readings (see ``counters_unchanged``)
    out = []
    narrow_or_slow = ("pcie_link_width", "pcie_link_generation")  # below their maxima
    for reading, jobs in history.columns().where_moved_or(history.gpus_moved(), (), narrow_or_slow):
        gen, gen_max = reading.pcie_link_generation, reading.pcie_link_generation_max
        width, width_max = reading.pcie_link_width, reading.pcie_link_width_max
        problems = []
        narrow = width is not None and width_max is not None and width < width_max
        slow = gen is not None and gen_max is not None and gen < gen_max
        if narrow:
            problems.append(f"x{width} instead of x{width_max}")
        busy = slow and _busy(reading, busy_util, busy_traffic)
        if slow and (narrow or busy):
            problems.append(f"Gen{gen} instead of Gen{gen_max}" + (" while busy" if busy else ""))
        if not problems and (
            (
                (before := first.get(reading.uuid)) is not None
                and before.pcie_replays_total == reading.pcie_replays_total
            )
            or counters_unchanged(history, start, reading, now - window, PCIE_REPLAYS)
        ):
            continue  # no replay counted in the window: nothing to report (the common case, checked cheaply)
        replays = _increase(history, reading.uuid, now, window, lambda r: r.pcie_replays_total)
        per_minute = replays[0] / replays[1] * 60.0 if replays else 0.0
        if per_minute > replay_limit:
            problems.append(f"{per_minute:.0f} replays/min")
        if not problems:
            continue
        best = pcie_max_bytes_per_second(gen_max, width_max)
        now_max = pcie_max_bytes_per_second(gen, width)
        value = now_max / best if best and now_max else None
        what = f"PCIe link degraded: {'; '.join(problems)}"
        description = f"The link runs at Gen{gen} x{width}; its maximum is Gen{gen_max} x{width_max}." + (
            f" PCIe replays: {per_minute:.0f} per minute (health limit {replay_limit:g})." if replays else ""
        )
        out.append(_candidate(rule, reading, jobs, value, what, description))
    return out


def _busy(reading: GpuReading, busy_util: float, busy_traffic: float) -> bool:
    """Doing real work: busy enough that a healthy link would run at its maximum generation."""
    if reading.utilization_ratio is not None and reading.utilization_ratio >= busy_util:
        return True
    ceiling = pcie_max_bytes_per_second(reading.pcie_link_generation, reading.pcie_link_width)
    rates = [v for v in (reading.pcie_tx_bytes_per_second, reading.pcie_rx_bytes_per_second) if v is not None]
    return bool(ceiling and rates and max(rates) >= busy_traffic * ceiling)


def nvlink_errors(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    crc_limit = rule.threshold("crc_per_second")
    window = rule.threshold("window_s")
    start = history.round_since(now - window)
    first = start.gpus if start is not None else {}  # the window's first readings (see ``counters_unchanged``)
    out = []
    for reading, jobs in history.columns().where_moved_or(history.gpus_moved()):
        if not reading.nvlink_links_active:
            continue
        before = first.get(reading.uuid)
        if (
            before is not None and NVLINK_ERROR_COUNTERS(before) == NVLINK_ERROR_COUNTERS(reading)
        ) or counters_unchanged(history, start, reading, now - window, NVLINK_ERROR_COUNTERS):
            continue  # no error counted in the window (the common case, checked cheaply)
        rates = {}
        for name, get in (
            ("CRC flits", lambda r: r.nvlink_crc_flit_errors_total),
            ("replays", lambda r: r.nvlink_replay_errors_total),
            ("recoveries", lambda r: r.nvlink_recovery_errors_total),
        ):
            inc = _increase(history, reading.uuid, now, window, get)
            if inc is not None:
                rates[name] = inc[0] / inc[1]
        crc = rates.get("CRC flits", 0.0)
        if not (crc > crc_limit or rates.get("replays", 0.0) > 0 or rates.get("recoveries", 0.0) > 0):
            continue
        parts = [f"{rate:.3g} {name}/s" for name, rate in rates.items() if rate > 0]
        what = f"NVLink errors: {', '.join(parts)}"
        description = (
            f"NVLink error rates over the last {format_duration(window)}: {', '.join(parts)} (CRC limit "
            f"{crc_limit:g}/s; any replay or recovery counts)."
        )
        out.append(_candidate(rule, reading, jobs, crc, what, description))
    return out


def xid_error(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    codes = rule.codes("codes")
    window = rule.threshold("window_s")
    out = []
    for reading, jobs in _xid_gpus(history):  # most GPUs have none
        if not any(code in codes for code in reading.xid_errors):
            continue
        oldest = history.reading_since(reading.uuid, now - window)
        if oldest is None or oldest[1] is reading:
            continue  # no earlier reading to compare with: the count may be old
        # a lost GPU keeps the XIDs the kernel log gave it; one read without counts counts from zero
        before = oldest[1].xid_errors if oldest[1].up or oldest[1].xid_errors else {}
        for code, count in sorted(reading.xid_errors.items()):
            increase = count - before.get(code, 0)
            if code in codes and increase > 0:
                entry = XID_BY_CODE.get(code)
                meaning = entry.name if entry else XID_MEANINGS.get(code, "not in gpulens's XID catalogue")
                action = xid_action(code, count)  # the count since the exporter started: escalation's lower bound
                events = "1 event" if increase == 1 else f"{increase} events"
                what = f"XID {code} ({meaning}), {events} in the last {format_duration(window)}; action: {action}"
                cause = f" Likely cause: {entry.cause}." if entry else ""
                description = (
                    f"The driver reported XID {code}: {meaning}.{cause} Action: {action}. Count since the exporter "
                    f"started: {count}."
                )
                out.append(_candidate(rule, reading, jobs, float(increase), what, description, {"xid": str(code)}))
    return out


def ecc_uncorrectable(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    window = rule.threshold("window_s")
    start = history.round_since(now - window)
    first = start.gpus if start is not None else {}  # the window's first readings (see ``counters_unchanged``)
    out = []
    for reading, jobs in history.columns().where_moved_or(history.gpus_moved(), ("remapped_rows_failure",)):
        if not reading.remapped_rows_failure and (
            (
                (before := first.get(reading.uuid)) is not None
                and before.ecc_uncorrected_errors_total == reading.ecc_uncorrected_errors_total
            )
            or counters_unchanged(history, start, reading, now - window, ECC_UNCORRECTED)
        ):
            continue  # no failure, and no error counted in the window (the common case, checked cheaply)
        increase = _increase(history, reading.uuid, now, window, lambda r: r.ecc_uncorrected_errors_total)
        errors = increase[0] if increase else 0.0
        failed = bool(reading.remapped_rows_failure)
        if not errors and not failed:
            continue
        parts = []
        if errors:
            parts.append(f"{errors:.0f} uncorrectable ECC errors in the last {format_duration(window)}")
        if failed:
            parts.append("row remapping failed")
        what = "; ".join(parts)
        description = "The GPU's memory returned uncorrectable data. " + (
            "A failed row remapping means the GPU needs service." if failed else ""
        )
        out.append(_candidate(rule, reading, jobs, errors, what, description.strip()))
    return out


def gpu_lost(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    latest = history.latest
    if latest is None:
        return []
    out = []
    for uuid, reading in latest.gpus.items():
        if reading.up:
            continue
        jobs = latest.gpu_jobs.get(uuid, ())
        what = "lost: the GPU no longer answers"
        description = (
            "The GPU no longer answers: NVML reports it lost (XID 79, fallen off the bus) or it vanished from its "
            "dcgm-exporter's page; only its identity is known."
        )
        out.append(_candidate(rule, reading, jobs, None, what, description))
    return out


def idle_allocated(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    limit = rule.threshold("utilization_max")
    cols = history.columns()
    out = []
    held = cols.zip("jobs", "utilization_ratio")
    for reading, jobs in cols.where(j and u is not None and u < limit for j, u in held):
        util = reading.utilization_ratio
        if not jobs or util is None or util >= limit:
            continue
        since = _idle_since(history, reading.uuid, limit, now)
        what = f"allocated but idle, {percent(util)} utilization" + (
            f" for {format_duration(now - since)}" if now > since else ""
        )
        description = (
            f"The GPU is held by job {', '.join(sorted({j.job_id for j in jobs}))} but its utilization stays "
            f"below {percent(limit)}."
        )
        out.append(_candidate(rule, reading, jobs, util, what, description))
    return out


def _idle_since(history: History, uuid: str, limit: float, now: float) -> float:
    """The first round of the GPU's current spell below ``limit`` (its latest reading is): the oldest reading of the
    unbroken run of idle readings that ends with the latest.

    A GPU idle the round before carries on from that round's answer (kept in the memo) when its series gained only
    the latest reading since: the spell is then the same, cut at the window's start, and no walk back is needed."""
    series = history.series(uuid)
    key = ("idle_since", uuid, limit)
    before = history.previous_memo().get(key)
    if before is not None and len(series) >= 2 and series[-2][0] == before[1]:
        since = before[0] if before[0] >= series[0][0] else series[0][0]
    else:
        since = now
        for t, r in reversed(series):
            if not r.up or r.utilization_ratio is None or r.utilization_ratio >= limit:
                break
            since = t
    if series:
        history.memo()[key] = (since, series[-1][0])
    return since


def exporter_down(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    latest = history.latest
    if latest is None:
        return []
    out = []
    for target in latest.targets:
        if target.up:
            continue
        name = redact_url(target.target)
        subject = {"node": target.node or "", "target": name}
        labels = rule_labels(rule, subject)
        since = history.target_down_since(target.target)
        duration = f" for {format_duration(now - since)}" if since is not None and now > since else ""
        who = target.node or name
        error = f": {target.last_error}" if target.last_error else ""
        summary = f"node {who}: exporter not answering{duration}{error}"
        description = f"Scrapes of {redact_url(target.url)} fail{error}. The node's other alerts are muted."
        out.append(Candidate(rule.name, labels, None, summary, description))
    return out
