"""Each builtin rule said in PromQL over gpulens's families: what ``gpulens rules export --format prometheus`` writes.

One function per exportable rule, named in its catalogue entry (``alerts.catalogue``), taking the rule as configured
(its thresholds and ``for``) and returning its Prometheus alerting rules (``Exported``). Each expression says the
rule's check (``alerts.checks``, ``alerts.detect``, ``alerts.fabricchecks``) as closely as PromQL can:

- a GPU rule keeps one series per GPU (``by (node, gpu, uuid, model)``), however many of its parts hold, so that
  Prometheus raises one alert per GPU as the engine does;
- a counter's first event counts: the exporter emits a counter series (an XID code) only once it has happened, so
  the series begins at 1 and ``increase`` over a window that begins before it is 0; ``_grew`` also names a series
  above 0 that began after the GPU's first reading in the window (not one that began with it: no earlier reading);
- ``CommunicationStall``'s utilisation signatures compare a job with its busiest traffic of the last 30 minutes (the
  engine's baselines are longer and know the job's pauses), and its NCCL signatures read the RAS families.
"""

from __future__ import annotations

from typing import Final

from gpulens.alerts import promqlnccl
from gpulens.alerts.base import AlertRule
from gpulens.alerts.definition import Exported
from gpulens.hardware import PCIE_LANE_BYTES_PER_SECOND
from gpulens.storage.prometheus import targets

GPU: Final = "node, gpu, uuid, model"
ON_GPU: Final = "on(node, gpu, uuid)"
JOB_INFO: Final = "max by (node, gpu, uuid, job_id, user) (gpulens_gpu_job_info)"
ON_PORT: Final = "on(node, device, port)"
PORT_GPUS: Final = f"* {ON_PORT} group_left(gpus) max by (node, device, port, gpus) (gpulens_nic_info)"
GPU_NAME: Final = "GPU {{ $labels.node }}:{{ $labels.gpu }}"
USER: Final = "{{ with $labels.user }} of user {{ . }}{{ end }}"
# The XID's name and action from the exporter's gpulens_gpu_xid_action_info (the XID catalogue), where it serves it.
XID_ACTION: Final = (
    '{{ with query (printf "gpulens_gpu_xid_action_info{uuid=%q,xid=%q}" $labels.uuid $labels.xid) }}'
    '{{ with first . }} ({{ label "name" . }}; action: {{ label "action" . }}){{ end }}{{ end }}'
)


def duration(seconds: float) -> str:
    """A PromQL duration: ``10m``, ``1h``, ``90s``."""
    seconds = int(seconds)
    if seconds % 3600 == 0 and seconds:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0 and seconds:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def per_gpu(expr: str) -> str:
    """``expr`` as one series per GPU (its parts' label sets differ: a sensor, a reason, a link state)."""
    return f"max by ({GPU}) ({expr})"


def _grew(selector: str, window_s: float) -> str:
    """The series of the counter ``selector`` that grew within ``window_s``, or began above 0 within it after the
    GPU's first reading in it (a first event: the series has fewer samples in the window than the GPU's ``up``).
    A series that begins with the GPU's first reading (a GPU or an exporter Prometheus has just begun to scrape)
    counts no event, as the engine counts none without an earlier reading to compare with."""
    window = duration(window_s)
    began = f"count_over_time({selector}[{window}]) < {ON_GPU} group_left() count_over_time(gpulens_gpu_up[{window}])"
    return f"(increase({selector}[{window}]) > 0 or ({selector} > 0 and {began}))"


def _gpu_rule(rule: AlertRule, expr: str) -> list[Exported]:
    return [Exported(per_gpu(expr), rule.for_s, f"{rule.name} on {GPU_NAME} ({{{{ $labels.uuid }}}}).")]


def port_rule(rule: AlertRule, expr: str) -> list[Exported]:
    summary = f"{rule.name} on {{{{ $labels.node }}}} port {{{{ $labels.device }}}} {{{{ $labels.port }}}}."
    return [Exported(expr, rule.for_s, summary)]


def pcie_ceiling(state: str) -> str:
    """The link's bytes/s per direction at its ``state`` (``max``, ``current``) generation and width."""
    gen, width = "gpulens_gpu_pcie_link_generation", "gpulens_gpu_pcie_link_width"
    cases = " or ".join(
        f'({gen}{{state="{state}"}} == {g}) * 0 + {rate:g}' for g, rate in PCIE_LANE_BYTES_PER_SECOND.items()
    )
    return f'(max by ({GPU}) ({cases}) * {ON_GPU} max by ({GPU}) ({width}{{state="{state}"}}))'


def _busier(family: str) -> str:
    """The busier direction's rate of a link family, one series per GPU."""
    return f"max by ({GPU}) ({family})"


# ------------------------------------------------------------------------------------------------ GPU rules


def memory_saturated(rule: AlertRule) -> list[Exported]:
    ratio = rule.threshold("used_ratio")
    return _gpu_rule(
        rule,
        f"gpulens_gpu_memory_used_bytes >= {ON_GPU} group_left() ({ratio:g} * gpulens_gpu_memory_total_bytes)",
    )


def thermal_throttling(rule: AlertRule) -> list[Exported]:
    margin = rule.threshold("margin_celsius")
    reason = "gpulens_gpu_throttle_active"
    return _gpu_rule(
        rule,
        f'{reason}{{reason=~"sw_thermal|hw_thermal"}} == 1 '
        f'or ({reason}{{reason="hw_slowdown"}} == 1 unless {ON_GPU} {reason}{{reason="hw_power_brake"}} == 1) '
        f'or gpulens_gpu_temperature_celsius{{sensor="gpu"}} >= {ON_GPU} group_left() '
        f"(gpulens_gpu_slowdown_temperature_celsius - {margin:g})",
    )


def power_capped(rule: AlertRule) -> list[Exported]:
    """Drawing ``power_ratio`` of its limit with sw_power_cap set; a pause in the work (utilization below
    ``busy_utilization``) within ``for`` of a capped evaluation holds the alert (the engine neither counts nor
    resets a pause; here it counts toward ``for``, and a pause alone never starts the alert)."""
    capped = (
        f"gpulens_gpu_power_watts >= {ON_GPU} group_left() ({rule.threshold('power_ratio'):g} * "
        f'gpulens_gpu_power_limit_watts) and {ON_GPU} gpulens_gpu_throttle_active{{reason="sw_power_cap"}} == 1'
    )
    recently = duration(max(rule.for_s, 60.0))
    paused = (
        f"gpulens_gpu_utilization_ratio < {rule.threshold('busy_utilization'):g} "
        f"and {ON_GPU} count_over_time(({capped})[{recently}:1m])"
    )
    return _gpu_rule(rule, f"{capped} or {paused}")


def hw_power_brake(rule: AlertRule) -> list[Exported]:
    return _gpu_rule(rule, 'gpulens_gpu_throttle_active{reason="hw_power_brake"} == 1')


def pcie_saturated(rule: AlertRule) -> list[Exported]:
    share = rule.threshold("utilization_ratio")
    return _gpu_rule(
        rule,
        f"{_busier('gpulens_gpu_pcie_throughput_bytes_per_second')} >= {ON_GPU} group_left() "
        f"({share:g} * {pcie_ceiling('max')})",
    )


def nvlink_saturated(rule: AlertRule) -> list[Exported]:
    share = rule.threshold("utilization_ratio") * rule.threshold("link_bytes_per_second")
    return _gpu_rule(
        rule,
        f"{_busier('gpulens_gpu_nvlink_throughput_bytes_per_second')} >= {ON_GPU} group_left() "
        f"({share:g} * max by ({GPU}) (gpulens_gpu_nvlink_links_active > 0))",
    )


def pcie_degraded(rule: AlertRule) -> list[Exported]:
    """A narrow link always; a lower generation while the GPU is busy (utilization, or traffic against the link's
    current rate); PCIe replays per minute over the window above the limit."""
    t = rule.threshold
    width, gen = "gpulens_gpu_pcie_link_width", "gpulens_gpu_pcie_link_generation"
    busy = (
        f"(gpulens_gpu_utilization_ratio >= {t('busy_utilization'):g} or {ON_GPU} "
        f"{_busier('gpulens_gpu_pcie_throughput_bytes_per_second')} >= {ON_GPU} "
        f"({t('busy_traffic_ratio'):g} * {pcie_ceiling('current')}))"
    )
    window = duration(t("window_s"))
    return _gpu_rule(
        rule,
        f'({width}{{state="current"}} < ignoring(state) {width}{{state="max"}}) '
        f'or (({gen}{{state="current"}} < ignoring(state) {gen}{{state="max"}}) and {ON_GPU} {busy}) '
        f"or (increase(gpulens_gpu_pcie_replays_total[{window}]) * 60 / {t('window_s'):g} "
        f"> {t('replays_per_minute'):g})",
    )


def nvlink_errors(rule: AlertRule) -> list[Exported]:
    window = duration(rule.threshold("window_s"))
    return _gpu_rule(
        rule,
        f'rate(gpulens_gpu_nvlink_errors_total{{type="crc_flit"}}[{window}]) > {rule.threshold("crc_per_second"):g} '
        f"or {_grew(_NVLINK_FAULTS, rule.threshold('window_s'))}",
    )


_NVLINK_FAULTS: Final = 'gpulens_gpu_nvlink_errors_total{type=~"replay|recovery"}'


def xid_error(rule: AlertRule) -> list[Exported]:
    """One alert per GPU and code, as the engine raises them (``xid`` is part of the identity)."""
    codes = "|".join(str(c) for c in sorted(rule.codes("codes")))
    selector = f'gpulens_gpu_xid_errors_total{{xid=~"{codes}"}}'
    expr = f"max by ({GPU}, xid) ({_grew(selector, rule.threshold('window_s'))})"
    summary = f"XidError on {GPU_NAME}: the driver reported XID {{{{ $labels.xid }}}}{XID_ACTION}."
    return [Exported(expr, rule.for_s, summary)]


def ecc_uncorrectable(rule: AlertRule) -> list[Exported]:
    selector = 'gpulens_gpu_ecc_errors_total{type="uncorrected"}'
    return _gpu_rule(rule, f"{_grew(selector, rule.threshold('window_s'))} or gpulens_gpu_remapped_rows_failure == 1")


def gpu_lost(rule: AlertRule) -> list[Exported]:
    return _gpu_rule(rule, "gpulens_gpu_up == 0")


def idle_allocated(rule: AlertRule) -> list[Exported]:
    util = "max by (node, gpu, uuid) (gpulens_gpu_utilization_ratio)"
    expr = f"({util} < {rule.threshold('utilization_max'):g}) * {ON_GPU} group_left(job_id, user) {JOB_INFO}"
    return [Exported(expr, rule.for_s, f"{rule.name} on {GPU_NAME} ({{{{ $labels.uuid }}}}){USER}.")]


def job_straggler(rule: AlertRule) -> list[Exported]:
    """A GPU of a busy multi-GPU job (every GPU at ``busy_utilization`` or more) whose SM clock is below
    ``clock_ratio`` of the job's median, whose power differs from the job's median by ``power_difference`` or more,
    while the job's median power is below ``peer_power_ratio`` of its highest of the last 30 minutes (the peers
    wait). The engine's peers' medians leave the GPU itself out and its baseline is longer; a lone throttle reason
    is not said here."""
    t = rule.threshold

    def with_job(family: str) -> str:
        return f"max by (node, gpu, uuid) ({family}) * {ON_GPU} group_left(job_id, user) {JOB_INFO}"

    clock, power = with_job('gpulens_gpu_clock_hertz{clock="sm"}'), with_job("gpulens_gpu_power_watts")
    median_power = f"quantile by (job_id) (0.5, {power})"
    slow = f"({clock}) < on(job_id) group_left() ({t('clock_ratio'):g} * quantile by (job_id) (0.5, {clock}))"
    differs = f"abs(({power}) / on(job_id) group_left() {median_power} - 1) >= {t('power_difference'):g}"
    waiting = f"{median_power} <= {t('peer_power_ratio'):g} * max_over_time(({median_power})[30m:1m])"
    paused = (
        f"count by (job_id) ((max by (node, gpu, uuid) (gpulens_gpu_utilization_ratio) < {t('busy_utilization'):g}) "
        f"* {ON_GPU} group_left(job_id) {JOB_INFO})"
    )
    expr = (
        f"{slow} and on(node, gpu, uuid, job_id) ({differs}) and on(job_id) ({waiting}) "
        f"and on(job_id) (count by (job_id) ({JOB_INFO}) >= 2) unless on(job_id) {paused}"
    )
    return [Exported(expr, rule.for_s, f"JobStraggler: {GPU_NAME} holds back job {{{{ $labels.job_id }}}}{USER}.")]


def watchdog(rule: AlertRule) -> list[Exported]:
    summary = "An alert that always fires while Prometheus evaluates the gpulens rules: its alerting pipeline works."
    return [Exported("vector(1)", rule.for_s, summary)]  # Prometheus's conventional dead-man's switch


# ------------------------------------------------------------------------------------------------ fabric rules

_SPEED: Final = "gpulens_nic_link_speed_bytes_per_second"


def ib_link_down(rule: AlertRule) -> list[Exported]:
    return port_rule(
        rule,
        f"((gpulens_nic_up == 0) and {ON_PORT} (max_over_time(gpulens_nic_up[1h]) == 1 "
        f"or gpulens_nic_link_downed_total > 0)) {PORT_GPUS}",
    )


def ib_link_flapping(rule: AlertRule) -> list[Exported]:
    window = duration(rule.threshold("window_s"))
    return port_rule(rule, f"increase(gpulens_nic_link_downed_total[{window}]) > {rule.threshold('flaps_max'):g}")


def ib_link_degraded(rule: AlertRule) -> list[Exported]:
    return port_rule(
        rule,
        f"({_SPEED} < max_over_time({_SPEED}[1d]) or {_SPEED} < on(node) group_left() "
        f"({rule.threshold('peer_rate_ratio'):g} * quantile by (node) (0.5, {_SPEED}))) "
        f"and {ON_PORT} gpulens_nic_up == 1",
    )


def ib_errors(rule: AlertRule) -> list[Exported]:
    window = duration(rule.threshold("window_s"))
    return port_rule(
        rule, f"increase(gpulens_nic_symbol_errors_total[{window}]) > {rule.threshold('symbol_errors_max'):g}"
    )


def fabric_congestion(rule: AlertRule) -> list[Exported]:
    t = rule.threshold
    wait = "rate(gpulens_nic_transmit_wait_total[5m])"
    return port_rule(
        rule,
        f"{wait} >= {t('wait_ratio'):g} * quantile_over_time(0.5, {wait}[1h:5m]) "
        f"and {wait} >= {t('wait_min_per_second'):g} "
        f"and {ON_PORT} rate(gpulens_nic_transmit_bytes_total[5m]) < {ON_PORT} ({t('traffic_ratio_max'):g} * {_SPEED})",
    )


def fabric_saturated(rule: AlertRule) -> list[Exported]:
    """A direction's rate between the port's last two scrapes (``irate``, as the engine's between two rounds) at
    ``utilization_ratio`` of its link speed or more."""
    share = rule.threshold("utilization_ratio")
    return port_rule(
        rule,
        " or ".join(
            f"irate(gpulens_nic_{direction}_bytes_total[2m]) >= {ON_PORT} ({share:g} * {_SPEED})"
            for direction in ("transmit", "receive")
        ),
    )


# ------------------------------------------------------------------------------------------------ job rules

_UTIL: Final = "max by (node, gpu, uuid) (gpulens_gpu_utilization_ratio)"
# NVLink and PCIe traffic per GPU: one sum over both families, so that a GPU without NVLink (a PCIe card) has one
_TRAFFIC: Final = 'sum by (node, gpu, uuid) ({__name__=~"gpulens_gpu_(nvlink|pcie)_throughput_bytes_per_second"})'
_MEMORY: Final = "max by (node, gpu, uuid) (gpulens_gpu_memory_used_bytes)"
_STALL_SHAPES: Final = {
    "spinning": "spin at full utilization",
    "blocked": "sit idle holding their memory",
    "mixed": "spin or sit idle",
}


def _per_job(per_gpu_expr: str) -> str:
    """How many of each job's GPUs ``per_gpu_expr`` selects."""
    return f"count by (job_id, user) (({per_gpu_expr}) * {ON_GPU} group_left(job_id, user) {JOB_INFO})"


def _nccl(rule: AlertRule) -> tuple[str, str, str]:
    """``CommunicationStall``'s NCCL signatures per job (``alerts.ncclchecks``): (``rank_dead``, ``rank_missing``,
    the jobs with a rank dead or unresponsive however briefly).

    ``rank_dead``: a rank RAS considers dead (at once), or unresponsive for ``ras_mismatch_for`` (every sample
    within it). ``rank_missing``: a rank behind its communicator (``gpulens_nccl_rank_lag``, exported only for a rank
    that answers) in a node's answer whose communicator has shown the same mismatch for ``ras_mismatch_for``, in a
    job with no rank dead or unresponsive, unless every such rank copies to the host (``alerts.promqlnccl``)."""
    hold = rule.threshold("ras_mismatch_for")
    held, unresponsive = duration(hold), "gpulens_nccl_rank_unresponsive"
    dead = (  # unresponsive for the whole hold: a series another node's answer starts at 1 must be that old
        f"count by (job_id) (gpulens_nccl_rank_dead == 1 "
        f"or (min_over_time({unresponsive}[{held}]) == 1 and ({unresponsive} offset {held}) == 1))"
    )
    gone = f"count by (job_id) ({unresponsive} == 1)"
    missing = promqlnccl.rank_missing(hold, rule.threshold("checkpoint_max_s"))
    return dead, f"{missing} unless on(job_id) {gone}", gone


def _with_user(per_job: str) -> str:
    """``per_job`` (one series per ``job_id``) labelled with the job's ``user``."""
    return f"({per_job}) * on(job_id) group_left(user) max by (job_id, user) (gpulens_gpu_job_info)"


def communication_stall(rule: AlertRule) -> list[Exported]:
    """One rule per signature: the NCCL ones (``rank_dead``, ``rank_missing``) from the RAS families, and the
    utilisation ones (spinning, blocked, mixed) for jobs NCCL names no stuck rank of (the engine's NCCL signatures
    replace them); their baselines are approximated by the busiest traffic (and the most memory) of the last 30
    minutes, and no rule knows the job's own pauses."""
    t = rule.threshold
    total = f"count by (job_id, user) ({JOB_INFO})"
    spinning = f"({_UTIL} >= {t('utilization_min'):g})"
    idle = f"({_UTIL} <= {t('idle_utilization_max'):g})"

    def quiet(baseline: float) -> str:
        """Traffic below ``quiet_ratio`` of the GPU's busiest of the last 30 minutes, which moved ``baseline``."""
        busiest = f"max_over_time({_TRAFFIC}[30m:1m])"
        return f"{ON_GPU} ({_TRAFFIC} < {t('quiet_ratio'):g} * {busiest}) and {ON_GPU} ({busiest} >= {baseline:g})"

    dead, missing, gone = _nccl(rule)
    named = f"unless on(job_id) ({gone} or {missing})"  # NCCL names stuck ranks: its signatures replace these
    spun = f"{spinning} and {quiet(t('baseline_traffic_min_bytes_per_second'))}"
    held = (
        f"{quiet(t('blocked_baseline_traffic_min_bytes_per_second'))} "
        f"and {ON_GPU} ({_MEMORY} >= {t('memory_held_ratio'):g} * max_over_time({_MEMORY}[30m:1m]))"
    )
    whole = f"== {total} and {total} >= 2"
    later = rule.for_s + t("blocked_after_s")
    exprs = {
        "spinning": (f"{_per_job(spun)} {whole} {named}", rule.for_s),
        "blocked": (f"{_per_job(f'{idle} and {held}')} {whole} {named}", later),
        "mixed": (
            f"{_per_job(f'({spinning} or {idle}) and {held}')} {whole} "
            f"and on(job_id, user) {_per_job(spinning)} >= 1 and on(job_id, user) {_per_job(idle)} >= 1 {named}",
            later,
        ),
    }
    hardware = [
        Exported(
            expr,
            for_s,
            f"CommunicationStall ({signature}): job {{{{ $labels.job_id }}}}{USER}: its {{{{ $value }}}} GPUs "
            f"{_STALL_SHAPES[signature]} with no NVLink or PCIe traffic.",
            {"signature": signature},
        )
        for signature, (expr, for_s) in exprs.items()
    ]
    job = f"CommunicationStall ({{{{ $labels.signature }}}}): job {{{{ $labels.job_id }}}}{USER}: NCCL RAS"
    return [
        Exported(
            _with_user(dead),
            0.0,
            f"{job} finds {{{{ $value }}}} rank(s) dead or unresponsive.",
            {"signature": "rank_dead"},
        ),
        Exported(
            _with_user(missing),
            0.0,
            f"{job} shows {{{{ $value }}}} rank(s) that never launched the collective the others wait in.",
            {"signature": "rank_missing"},
        ),
        *hardware,
    ]


def gpu_driver_hung(rule: AlertRule) -> list[Exported]:
    """A node whose exporter says an NVML call passed its deadline."""
    summary = f"{rule.name}: the GPU driver of {{{{ $labels.node }}}} is hung (an NVML call does not return)."
    return [Exported("max by (node) (gpulens_node_nvml_hung) == 1", rule.for_s, summary)]


def exporter_down(rule: AlertRule) -> list[Exported]:
    """A watched target whose last scrape failed (the same selector the engine's reads of the targets use)."""
    summary = "ExporterDown: the exporter at {{ $labels.instance }} (job {{ $labels.job }}) does not answer."
    return [Exported(targets.exporter_down(), rule.for_s, summary)]


# --- the node's hardware (alerts.hardwarechecks) ----------------------------------------------------------------------
