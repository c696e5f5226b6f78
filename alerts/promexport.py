"""``gpulens rules export --format prometheus``: the builtin rules as a Prometheus rules file over gpulens metrics.

For operators who alert with Prometheus and Alertmanager rather than (or next to) the collector. The threshold rules
translate one to one, with the thresholds and ``for`` durations of the given rules (so config overrides carry over).
``CommunicationStall`` and ``JobStraggler`` compare a job with its own baseline and its peers; PromQL can express
approximations of both, given here, but the collector's detectors are more careful (baseline lengths, pauses, dead
profiling counters); docs/alerts-detection.md explains the difference. ``CommunicationStall`` is exported as three
rules, one per ``signature`` (spinning, blocked, mixed); the blocked and mixed ones wait ``blocked_after_s`` more.

The fabric rules translate over the ``gpulens_nic_*`` families, labelled ``node``, ``device`` and ``port`` (and
``gpus`` from ``gpulens_nic_info``); their baselines (a port's highest rate, its usual transmit wait) are
approximated over the last hour or day. ``Watchdog`` is Prometheus's conventional ``vector(1)``. ``NOT_EXPORTED``
lists the rules PromQL cannot express, with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

import yaml

from gpulens.alerts.base import AlertRule, percent, rate_text
from gpulens.alerts.catalogue import (
    COMMUNICATION_STALL,
    ECC_UNCORRECTABLE,
    EXPORTER_DOWN,
    FABRIC_CONGESTION,
    FABRIC_SATURATED,
    GPU_LOST,
    HW_POWER_BRAKE,
    IB_ERRORS,
    IB_LINK_DEGRADED,
    IB_LINK_DOWN,
    IB_LINK_FLAPPING,
    IDLE_ALLOCATED,
    JOB_INEFFICIENT,
    JOB_INPUT_BOUND,
    JOB_STRAGGLER,
    MEMORY_SATURATED,
    NVLINK_ERRORS,
    NVLINK_SATURATED,
    PCIE_DEGRADED,
    PCIE_SATURATED,
    POWER_CAPPED,
    THERMAL_THROTTLING,
    WATCHDOG,
    XID_ERROR,
)
from gpulens.alerts.selfhealth import self_health_group
from gpulens.config import format_duration
from gpulens.hardware import PCIE_LANE_BYTES_PER_SECOND
from gpulens.storage.prometheus.targets import exporter_down

_JOB = "max by (node, gpu, uuid, job_id, user) (gpulens_gpu_job_info)"
_PORT = "on(node, device, port)"
_GPUS = f"* {_PORT} group_left(gpus) max by (node, device, port, gpus) (gpulens_nic_info)"

# Builtins with no Prometheus rule, and why (docs/alerts.md repeats it).
NOT_EXPORTED: Final = {
    JOB_INEFFICIENT: "it counts a job's idle GPU readings over the rounds that list the job, which PromQL cannot "
    "bound per job",
    JOB_INPUT_BOUND: "it needs each job's cgroup CPU limit beside its GPUs' idle share and a checkpoint's writes, "
    "which the exported families do not join (the job CPU family carries no limit)",
}


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds % 3600 == 0 and seconds:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0 and seconds:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def _pcie_max() -> str:
    """The link's maximum bytes/s per direction, from its max generation and width."""
    cases = " or ".join(
        f'(gpulens_gpu_pcie_link_generation{{state="max"}} == {gen}) * 0 + {rate:g}'
        for gen, rate in PCIE_LANE_BYTES_PER_SECOND.items()
    )
    return f'(({cases}) * on(node, gpu, uuid, model) gpulens_gpu_pcie_link_width{{state="max"}})'


def _expr(rule: AlertRule) -> str | None:
    t = rule.threshold
    name = rule.name
    if name == MEMORY_SATURATED:
        return f"gpulens_gpu_memory_used_bytes / gpulens_gpu_memory_total_bytes >= {t('used_ratio'):g}"
    if name == THERMAL_THROTTLING:
        margin = t("margin_celsius")
        return (
            'max by (node, gpu, uuid, model) (gpulens_gpu_throttle_active{reason=~"sw_thermal|hw_thermal"}) == 1 '
            f'or gpulens_gpu_temperature_celsius{{sensor="gpu"}} >= on(node, gpu, uuid, model) '
            f"(gpulens_gpu_slowdown_temperature_celsius - {margin:g})"
        )
    if name == POWER_CAPPED:
        return (
            f"gpulens_gpu_power_watts >= {t('power_ratio'):g} * gpulens_gpu_power_limit_watts "
            'and on(node, gpu, uuid, model) gpulens_gpu_throttle_active{reason="sw_power_cap"} == 1 '
            f"and on(node, gpu, uuid, model) gpulens_gpu_utilization_ratio >= {t('busy_utilization'):g}"
        )
    if name == HW_POWER_BRAKE:
        return 'gpulens_gpu_throttle_active{reason="hw_power_brake"} == 1'
    if name == PCIE_SATURATED:
        return (
            "max by (node, gpu, uuid, model) (gpulens_gpu_pcie_throughput_bytes_per_second) "
            f">= {t('utilization_ratio'):g} * {_pcie_max()}"
        )
    if name == NVLINK_SATURATED:
        return (
            "max by (node, gpu, uuid, model) (gpulens_gpu_nvlink_throughput_bytes_per_second) "
            f">= {t('utilization_ratio'):g} * {t('link_bytes_per_second'):g} * gpulens_gpu_nvlink_links_active "
            "and gpulens_gpu_nvlink_links_active > 0"
        )
    if name == PCIE_DEGRADED:
        window = _duration(t("window_s"))
        return (
            '(gpulens_gpu_pcie_link_generation{state="current"} < ignoring(state) '
            'gpulens_gpu_pcie_link_generation{state="max"} '
            'or gpulens_gpu_pcie_link_width{state="current"} < ignoring(state) '
            'gpulens_gpu_pcie_link_width{state="max"}) '
            f"and on(node, gpu, uuid, model) gpulens_gpu_utilization_ratio >= {t('busy_utilization'):g} "
            f"or increase(gpulens_gpu_pcie_replays_total[{window}]) * 60 / {t('window_s'):g} "
            f"> {t('replays_per_minute'):g}"
        )
    if name == NVLINK_ERRORS:
        window = _duration(t("window_s"))
        return (
            f'rate(gpulens_gpu_nvlink_errors_total{{type="crc_flit"}}[{window}]) > {t("crc_per_second"):g} '
            f'or increase(gpulens_gpu_nvlink_errors_total{{type=~"replay|recovery"}}[{window}]) > 0'
        )
    if name == JOB_STRAGGLER:
        clock = 'max by (node, gpu, uuid) (gpulens_gpu_clock_hertz{clock="sm"})'
        with_job = f"{clock} * on(node, gpu, uuid) group_left(job_id, user) {_JOB}"
        peers = f"quantile by (job_id) (0.5, {with_job})"
        return (
            f"({with_job}) < on(job_id) group_left() ({t('clock_ratio'):g} * {peers}) "
            f"and on(job_id) (count by (job_id) ({_JOB}) >= 2)"
        )
    if name == IDLE_ALLOCATED:
        return (
            f"max by (node, gpu, uuid) (gpulens_gpu_utilization_ratio) < {t('utilization_max'):g} "
            f"and on(node, gpu, uuid) {_JOB}"
        )
    if name == XID_ERROR:
        codes = "|".join(str(int(c)) for c in rule.thresholds["codes"])  # type: ignore[union-attr]
        return f'increase(gpulens_gpu_xid_errors_total{{xid=~"{codes}"}}[{_duration(t("window_s"))}]) > 0'
    if name == ECC_UNCORRECTABLE:
        window = _duration(t("window_s"))
        return (
            f'increase(gpulens_gpu_ecc_errors_total{{type="uncorrected"}}[{window}]) > 0 '
            "or gpulens_gpu_remapped_rows_failure == 1"
        )
    if name == GPU_LOST:
        return "gpulens_gpu_up == 0"
    if name == WATCHDOG:
        return "vector(1)"  # Prometheus's conventional dead-man's switch
    fabric = _fabric_expr(rule)
    if fabric is not None:
        return fabric
    if name == EXPORTER_DOWN:
        return exporter_down()
    return None


def _fabric_expr(rule: AlertRule) -> str | None:
    """The fabric rules over the ``gpulens_nic_*`` families (values are ``0`` or the measured one)."""
    t = rule.threshold
    name = rule.name
    speed = "gpulens_nic_link_speed_bytes_per_second"
    if name == IB_LINK_DOWN:
        return (
            f"((gpulens_nic_up == 0) and {_PORT} (max_over_time(gpulens_nic_up[1h]) == 1 "
            f"or gpulens_nic_link_downed_total > 0)) {_GPUS}"
        )
    if name == IB_LINK_FLAPPING:
        window = _duration(t("window_s"))
        return f"increase(gpulens_nic_link_downed_total[{window}]) > {t('flaps_max'):g}"
    if name == IB_LINK_DEGRADED:
        return (
            f"({speed} < max_over_time({speed}[1d]) or {speed} < on(node) group_left() "
            f"({t('peer_rate_ratio'):g} * quantile by (node) (0.5, {speed}))) and {_PORT} gpulens_nic_up == 1"
        )
    if name == IB_ERRORS:
        window = _duration(t("window_s"))
        return f"increase(gpulens_nic_symbol_errors_total[{window}]) > {t('symbol_errors_max'):g}"
    if name == FABRIC_CONGESTION:
        wait = "rate(gpulens_nic_transmit_wait_total[5m])"
        return (
            f"{wait} >= {t('wait_ratio'):g} * quantile_over_time(0.5, {wait}[1h:5m]) "
            f"and {wait} >= {t('wait_min_per_second'):g} "
            f"and {_PORT} rate(gpulens_nic_transmit_bytes_total[5m]) < {_PORT} ({t('traffic_ratio_max'):g} * {speed})"
        )
    if name == FABRIC_SATURATED:
        share = t("utilization_ratio")
        return " or ".join(
            f"rate(gpulens_nic_{direction}_bytes_total[2m]) >= {_PORT} ({share:g} * {speed})"
            for direction in ("transmit", "receive")
        )
    return None


_UTIL = "max by (node, gpu, uuid) (gpulens_gpu_utilization_ratio)"
_TRAFFIC = (
    "(sum by (node, gpu, uuid) (gpulens_gpu_nvlink_throughput_bytes_per_second) "
    "+ on(node, gpu, uuid) sum by (node, gpu, uuid) (gpulens_gpu_pcie_throughput_bytes_per_second))"
)
_MEMORY = "max by (node, gpu, uuid) (gpulens_gpu_memory_used_bytes)"


def _per_job(per_gpu: str) -> str:
    """How many of each job's GPUs ``per_gpu`` selects."""
    return f"count by (job_id, user) (({per_gpu}) * on(node, gpu, uuid) group_left(job_id, user) {_JOB})"


def _stall_exprs(rule: AlertRule) -> list[tuple[str, str, float]]:
    """``CommunicationStall`` as (signature, expression, ``for``) per signature; baselines are approximated by the
    busiest traffic (and the most memory) of the last 30 minutes, and no rule knows the job's own pauses."""
    t = rule.threshold
    total = f"count by (job_id, user) ({_JOB})"
    spinning = f"({_UTIL} >= {t('utilization_min'):g})"
    idle = f"({_UTIL} <= {t('idle_utilization_max'):g})"

    def quiet(baseline: float) -> str:
        return (
            f"on(node, gpu, uuid) ({_TRAFFIC} < {baseline * t('quiet_ratio'):g}) "
            f"and on(node, gpu, uuid) (max_over_time({_TRAFFIC}[30m:1m]) >= {baseline:g})"
        )

    spun = f"{spinning} and {quiet(t('baseline_traffic_min_bytes_per_second'))}"
    held = (
        f"{quiet(t('blocked_baseline_traffic_min_bytes_per_second'))} "
        f"and on(node, gpu, uuid) ({_MEMORY} >= {t('memory_held_ratio'):g} * max_over_time({_MEMORY}[30m:1m]))"
    )
    whole = f"== {total} and {total} >= 2"
    later = rule.for_s + t("blocked_after_s")
    return [
        ("spinning", f"{_per_job(spun)} {whole}", rule.for_s),
        ("blocked", f"{_per_job(f'{idle} and {held}')} {whole}", later),
        (
            "mixed",
            f"{_per_job(f'({spinning} or {idle}) and {held}')} {whole} "
            f"and on(job_id, user) {_per_job(spinning)} >= 1 and on(job_id, user) {_per_job(idle)} >= 1",
            later,
        ),
    ]


_GPU_NAME = "GPU {{ $labels.node }}:{{ $labels.gpu }}"
_USER = "{{ with $labels.user }} of user {{ . }}{{ end }}"
_STALL_SHAPES: Final = {
    "spinning": "spin at full utilization",
    "blocked": "sit idle holding their memory",
    "mixed": "spin or sit idle",
}


def _summary(rule: AlertRule, expr: str, labels: dict[str, str]) -> str:
    """One sentence naming the alert's subject from the labels its expression keeps (a ``count by (job_id, user)``
    has no ``node``: the stall names its job)."""
    name = rule.name
    if name == COMMUNICATION_STALL:
        signature = labels["signature"]
        return (
            f"CommunicationStall ({signature}): job {{{{ $labels.job_id }}}}{_USER}: its {{{{ $value }}}} GPUs "
            f"{_STALL_SHAPES[signature]} with no NVLink or PCIe traffic."
        )
    if name == JOB_STRAGGLER:
        return f"JobStraggler: {_GPU_NAME} holds back job {{{{ $labels.job_id }}}}{_USER}."
    if name == EXPORTER_DOWN:
        return "ExporterDown: the exporter at {{ $labels.instance }} (job {{ $labels.job }}) does not answer."
    if name == XID_ERROR:
        return f"XidError on {_GPU_NAME}: the driver reported XID {{{{ $labels.xid }}}}."
    if name == WATCHDOG:
        return "An alert that always fires while Prometheus evaluates the gpulens rules: its alerting pipeline works."
    if "gpulens_nic_" in expr:
        return f"{name} on {{{{ $labels.node }}}} port {{{{ $labels.device }}}} {{{{ $labels.port }}}}."
    return f"{name} on {_GPU_NAME} ({{{{ $labels.uuid }}}})."


def _threshold_text(rule: AlertRule, name: str) -> str | None:
    """A threshold the way the description reads it: ``5%``, ``11m``, ``3.0 GB/s``; None for a word that is not
    one of the rule's thresholds."""
    if name == "for":
        return format_duration(rule.for_s)
    value = rule.thresholds.get(name)
    if value is None:
        return None
    if isinstance(value, tuple):
        return ", ".join(f"{v:g}" for v in value)
    if name.endswith("_s"):
        return format_duration(value)
    if name.endswith("bytes_per_second"):
        return rate_text(value)
    if name.endswith("_celsius"):
        return f"{value:g} °C"
    if any(word in name for word in ("ratio", "utilization", "difference")) and value <= 1:
        return percent(value)
    return f"{value:g}"


def _description(rule: AlertRule) -> str:
    """The rule's meaning with its thresholds filled in (no `quiet_ratio` left for the reader to look up)."""

    def fill(match: re.Match[str]) -> str:
        text = _threshold_text(rule, match.group(1))
        return match.group(0) if text is None else text

    text = re.sub(r"`(\w+)`", fill, rule.meaning)
    return re.sub(r"See '([^']+)'\.", r"See '\1' in gpulens's docs/alerts.md.", text)


def _entry(rule: AlertRule, expr: str, for_s: float, labels: dict[str, str]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "alert": rule.name,
        "expr": expr,
        "labels": {"severity": rule.severity, **dict(rule.labels), **labels},
        "annotations": {
            "summary": _summary(rule, expr, labels),
            "description": _description(rule),
            "runbook": rule.action,
        },
    }
    if for_s:
        entry["for"] = _duration(for_s)
    if rule.keep_firing_for_s:
        entry["keep_firing_for"] = _duration(rule.keep_firing_for_s)
    return entry


def prometheus_rules(rules: Sequence[AlertRule], *, group: str = "gpulens") -> dict[str, Any]:
    """A Prometheus rules document for the builtin rules among ``rules`` (user rules are skipped)."""
    out = []
    for rule in rules:
        if rule.name in NOT_EXPORTED:
            continue
        if rule.name == COMMUNICATION_STALL:
            out += [_entry(rule, expr, for_s, {"signature": sig}) for sig, expr, for_s in _stall_exprs(rule)]
            continue
        expr = _expr(rule)
        if expr is not None:
            out.append(_entry(rule, expr, rule.for_s, {}))
    return {"groups": [{"name": group, "rules": out}, *_self_health_groups()]}


# --- gpulens's own health (gpulens.alerts.selfhealth) -------------------------------------------------------------


def _self_health_groups() -> list[dict[str, Any]]:
    """The self-health rules, a group of their own: the collector, its spool and outbox, the exporters."""
    return [self_health_group()]


def prometheus_rules_yaml(rules: Sequence[AlertRule]) -> str:
    header = "# Generated by `gpulens rules export --format prometheus`; see docs/alerts.md.\n"
    return header + yaml.safe_dump(prometheus_rules(rules), sort_keys=False, width=1000)
