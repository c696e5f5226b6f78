"""The recording rules: the one table of the series gpulens asks Prometheus to record, and their rules file.

``gpulens rules export --format prometheus-recording`` writes ``rules_yaml()``; the reader
(``storage.prometheus.recorded``) and ``gpulens rules doctor`` read the names defined here, so a name is written once.
Names follow Prometheus's ``level:metric:operations`` convention. Each rule reads raw series only (no rule reads
another's output), so ``promtool tsdb create-blocks-from rules`` can backfill every one of them.

* ``cluster:gpulens_recording:time``: the evaluation time, labelled with the rules' ``interval``: whether the rules
  run, since when (a page's range is read from recorded series only where they cover it) and how often.
* per node (``node``): GPUs up, busy, idle and allocated-but-idle, their utilization summed, memory used and total,
  power and its limits (the overview's headline), the busiest NVLink's share of its maximum (gpulens families: links
  active x the common per-link rate).
* per job (``job_id``, ``user``): the GPUs held; per interval, its GPUs' utilization samples, sum and sum of squares
  and memory samples, sum and peak (summed over a range they give the job summaries of the jobs page exactly); the
  median and the standard deviation over its GPUs of utilization, memory, power and NVLink traffic now.
* per GPU (``node``, ``gpu``, ``uuid``, ``link``): the busier PCIe and NVLink directions as shares of their links'
  ceilings (the interconnect page's chart of every GPU; gpulens families); its link errors counted, NVLink and PCIe
  together (the page's GPUs with the most errors: a top-k over one series per GPU rather than over four); and 1
  where its links are degraded (a PCIe generation or width below its maximum, fewer NVLinks active than the most of
  its model), else 0 (the page's degraded GPUs, without joining every GPU's link fields at each load).
* per port (``node``, ``device``, ``port``): the problem flags (``FLAG_BITS``: down, degraded, saturated, as
  ``gpulens.storage.portproblems`` tells them) and whether an error counter rose in the rate window.

A GPU's value comes from its gpulens family, else from the highest-ranked dcgm-exporter name of any generation that
holds it, converted to gpulens units (``jobquery.per_gpu``'s choice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import yaml

from gpulens.dcgmfields import FREE
from gpulens.hardware import NVLINK_DEFAULT_LINK_BYTES_PER_SECOND
from gpulens.storage.portproblems import ERROR_FIELDS, SATURATED_AT
from gpulens.storage.prometheus import families as fam
from gpulens.storage.prometheus.client import quote
from gpulens.storage.prometheus.fabric import NIC_FIELDS, NIC_INFO, NIC_UP
from gpulens.storage.prometheus.families import fewer_links_active, field_selector, pcie_ceiling
from gpulens.storage.prometheus.jobquery import dcgm_identity, pairs, per_gpu
from gpulens.storage.records import IDLE_UTILIZATION, LINK_ERROR_FIELDS

GROUP: Final = "gpulens-recording"
PCIE_LINK_SHAPE: Final = ("pcie_link_generation", "pcie_link_width")  # each against its ``_max``
RULE_FILE: Final = "gpulens-recording.yml"  # under deploy/prometheus/rules/
INTERVAL_S: Final = 180  # 8.1 CPU-s an evaluation at 8,000 GPUs: 4.4-4.5 % of a core (BENCHMARKS.md)
SCRAPE_S: Final = 15  # the scrape interval the rate windows are made for (4 scrapes: the reader's window)

CLOCK: Final = "cluster:gpulens_recording:time"
NODE_UP: Final = "node:gpulens_gpus_up:count"
NODE_BUSY: Final = "node:gpulens_gpus_busy:count"
NODE_IDLE: Final = "node:gpulens_gpus_idle:count"
NODE_ALLOCATED_IDLE: Final = "node:gpulens_gpus_allocated_idle:count"
NODE_UTILIZATION: Final = "node:gpulens_gpu_utilization_ratio:sum"
NODE_MEMORY_USED: Final = "node:gpulens_gpu_memory_used_bytes:sum"
NODE_MEMORY_TOTAL: Final = "node:gpulens_gpu_memory_total_bytes:sum"
NODE_POWER: Final = "node:gpulens_gpu_power_watts:sum"
NODE_POWER_LIMIT: Final = "node:gpulens_gpu_power_limit_watts:sum"
NODE_NVLINK_BUSIEST: Final = "node:gpulens_gpu_nvlink_busiest:ratio"
JOB_GPUS: Final = "job:gpulens_gpus:count"
JOB_UTIL_N: Final = "job:gpulens_gpu_utilization_ratio:count_over_interval"
JOB_UTIL_SUM: Final = "job:gpulens_gpu_utilization_ratio:sum_over_interval"
JOB_UTIL_SQ: Final = "job:gpulens_gpu_utilization_ratio:sumsq_over_interval"
JOB_MEM_N: Final = "job:gpulens_gpu_memory_used_bytes:count_over_interval"
JOB_MEM_SUM: Final = "job:gpulens_gpu_memory_used_bytes:sum_over_interval"
JOB_MEM_MAX: Final = "job:gpulens_gpu_memory_used_bytes:max_over_interval"
GPU_LINK_LOAD: Final = "gpu:gpulens_gpu_link_load:ratio"
GPU_LINK_ERRORS: Final = "gpu:gpulens_gpu_link_errors:sum"
GPU_LINK_DEGRADED: Final = "gpu:gpulens_gpu_link_degraded:flag"
GPU_LINKS_UNSTEADY: Final = "gpu:gpulens_gpu_nvlink_links_active:unsteady"
PORT_FLAGS: Final = "port:gpulens_nic_problems:flags"
PORT_ERRORS: Final = "port:gpulens_nic_errors:rising"
FLAG_BITS: Final = (("down", 1), ("degraded", 2), ("saturated", 4))
# per job: the medians and spreads (standard deviation over its GPUs) of these fields now
SPREAD_FIELDS: Final = {
    "utilization_ratio": "gpulens_gpu_utilization_ratio",
    "memory_used_bytes": "gpulens_gpu_memory_used_bytes",
    "power_watts": "gpulens_gpu_power_watts",
    "nvlink_bytes_per_second": "gpulens_gpu_nvlink_throughput_bytes_per_second",
}
# what each page reads from recorded series, and which recorded names it needs
PAGE_NEEDS: Final = {
    "jobs": (CLOCK, JOB_GPUS, JOB_UTIL_N, JOB_UTIL_SUM, JOB_UTIL_SQ, JOB_MEM_N, JOB_MEM_SUM, JOB_MEM_MAX),
    "interconnect": (CLOCK, GPU_LINK_LOAD, GPU_LINK_ERRORS, GPU_LINK_DEGRADED, GPU_LINKS_UNSTEADY),
    "interconnect ports": (CLOCK, PORT_FLAGS, PORT_ERRORS),
    # the others may hold no series (a store without power limits): read as the readings' sums would give them, 0
    "overview": (CLOCK, NODE_UP),
}
_PORT: Final = "node, device, port"


@dataclass(frozen=True, slots=True)
class Rule:
    record: str
    expr: str
    labels: tuple[tuple[str, str], ...] = ()


def _gpu_now(field: str) -> str:
    """One series per GPU (labels ``node``, ``uuid``) of ``field`` now, in gpulens units, from either source."""
    parts = []
    for source in sorted(fam.sources(field), key=lambda s: (0 if s.dcgm else 10) + s.rank, reverse=True):
        expr = source.selector("")
        if source.factor != 1.0:
            expr = f"({expr}) * {source.factor!r}"
        parts.append(f"max by (node, uuid) ({dcgm_identity(expr) if source.dcgm else expr})")
    return " or on (uuid) ".join(f"({p})" for p in parts)


def _memory_total_now() -> str:
    """Every GPU's memory total now: its total where exported, else used + free + reserved (dcgm-exporter without
    ``FB_TOTAL``; reserved 0 where absent), as the reader tells it (``gpulens.dcgmpage``)."""
    used, free = _gpu_now("memory_used_bytes"), _gpu_now(FREE)
    reserved = f"({_gpu_now('memory_reserved_bytes')}) or on (uuid) (({used}) * 0)"
    derived = f"(({used}) + on (node, uuid) ({free})) + on (node, uuid) ({reserved})"
    return f"({_gpu_now('memory_total_bytes')}) or on (uuid) ({derived})"


def _up_now() -> str:
    """Every GPU up now (value 1): gpulens's ``up``, or a dcgm-exporter GPU that reports its utilization."""
    dcgm = dcgm_identity(fam.selector(fam.DCGM_PRESENCE))
    return f"(max by (node, uuid) ({fam.UP} == 1)) or on (uuid) (max by (node, uuid) ({dcgm}) * 0 + 1)"


def _held_now() -> str:
    return f"group by (uuid) ({pairs(None, '', dcgm=True)})"


def node_rules() -> list[Rule]:
    up = _up_now()
    util = f"({_gpu_now('utilization_ratio')}) and on (uuid) ({up})"
    idle = f"({util}) < {IDLE_UTILIZATION!r}"

    def of_up(field: str) -> str:
        values = _memory_total_now() if field == "memory_total_bytes" else _gpu_now(field)
        return f"sum by (node) (({values}) and on (uuid) ({up}))"

    links = fam.LINKS_ACTIVE
    traffic = "gpulens_gpu_nvlink_throughput_bytes_per_second"
    busiest = (
        f"max by (node) (max by (node, uuid) ({traffic}) / on (node, uuid) "
        f"(max by (node, uuid) ({links} > 0) * {NVLINK_DEFAULT_LINK_BYTES_PER_SECOND!r}))"
    )

    def count(expr: str) -> str:  # a node with none counts 0
        return f"count by (node) ({expr}) or on (node) (count by (node) ({up}) * 0)"

    return [
        Rule(NODE_UP, f"count by (node) ({up})"),
        Rule(NODE_BUSY, count(f"({util}) >= {IDLE_UTILIZATION!r}")),
        Rule(NODE_IDLE, count(idle)),
        Rule(NODE_ALLOCATED_IDLE, count(f"({idle}) and on (uuid) ({_held_now()})")),
        Rule(NODE_UTILIZATION, f"sum by (node) ({util})"),
        Rule(NODE_MEMORY_USED, of_up("memory_used_bytes")),
        Rule(NODE_MEMORY_TOTAL, of_up("memory_total_bytes")),
        Rule(NODE_POWER, of_up("power_watts")),
        Rule(NODE_POWER_LIMIT, of_up("power_limit_watts")),
        Rule(NODE_NVLINK_BUSIEST, busiest),
    ]


def job_rules(interval_s: int) -> list[Rule]:
    """Per job and interval: sums over its GPUs of their samples in the interval (``[interval]``: consecutive
    evaluations see each sample once, so summed over a range they are the range's: the window is a millisecond short
    of the interval, as Prometheus 2 includes a range's first instant)."""
    window = f"{interval_s * 1000 - 1}ms"
    held = f"group by (job_id, uuid, user) ({pairs(None, f'[{window}]', dcgm=True)})"
    util, memory = fam.sources("utilization_ratio"), fam.sources("memory_used_bytes")

    def per_job(sources: list[fam.Source], template: str, power: int, how: str = "sum") -> str:
        values = per_gpu(sources, template, window, power=power)
        return f"{how} by (job_id, user) ({held} * on (uuid) group_left () ({values}))"

    square = "count_over_time({s}) * (stddev_over_time({s}) ^ 2 + avg_over_time({s}) ^ 2)"
    rules = [
        Rule(JOB_GPUS, f"count by (job_id, user) ({held})"),
        Rule(JOB_UTIL_N, per_job(util, "count_over_time({s})", 0)),
        Rule(JOB_UTIL_SUM, per_job(util, "sum_over_time({s})", 1)),
        Rule(JOB_UTIL_SQ, per_job(util, square, 2)),
        Rule(JOB_MEM_N, per_job(memory, "count_over_time({s})", 0)),
        Rule(JOB_MEM_SUM, per_job(memory, "sum_over_time({s})", 1)),
        Rule(JOB_MEM_MAX, per_job(memory, "max_over_time({s})", 1, "max")),
    ]
    now = f"max by (job_id, uuid, user) ({pairs(None, '', dcgm=True)})"
    for field, family in SPREAD_FIELDS.items():
        if field == "nvlink_bytes_per_second":  # both directions
            tx, rx = (_gpu_now(f"nvlink_{d}_bytes_per_second") for d in ("tx", "rx"))
            values = (
                f'sum by (uuid) (label_replace(({tx}), "d", "tx", "", "") or label_replace(({rx}), "d", "rx", "", ""))'
            )
        else:
            values = _gpu_now(field)
        joined = f"{now} * on (uuid) group_left () ({values})"
        rules.append(Rule(f"job:{family}:median", f"quantile by (job_id, user) (0.5, {joined})"))
        rules.append(Rule(f"job:{family}:stddev", f"stddev by (job_id, user) ({joined})"))
    return rules


def link_rules(interval_s: int, scrape_s: int) -> list[Rule]:
    """Per GPU up (gpulens families; labels ``node``, ``gpu``, ``uuid``): the busier PCIe direction as a share of its
    current link's ceiling (``link="pcie"``), the busier NVLink direction as a share of its active links' ceiling at
    the common per-link rate (``link="nvlink"``, GPUs with links active), as ``gpulens.ratios.link_loads`` tells
    them; a GPU without a ceiling has no series of that link. Per GPU with an NVLink count: whether its links are
    unsteady (``links_unsteady``)."""
    by = "node, gpu, uuid"
    up = f"max by (uuid) ({fam.UP} == 1)"

    def busier(field: str) -> str:
        return f"max by ({by}) ({field_selector(field.format('tx'))} or {field_selector(field.format('rx'))})"

    links = f"max by (uuid) ({field_selector('nvlink_links_active')} > 0) * {NVLINK_DEFAULT_LINK_BYTES_PER_SECOND!r}"
    ceiling = f"max by (uuid) ({pcie_ceiling('current')} > 0)"
    pcie = f"{busier('pcie_{}_bytes_per_second')} / on (uuid) group_left () ({ceiling})"
    nvlink = f"{busier('nvlink_{}_bytes_per_second')} / on (uuid) group_left () ({links})"
    expr = " or ".join(
        f'label_replace(({ratio}) and on (uuid) ({up}), "link", "{link}", "", "")'
        for link, ratio in (("pcie", pcie), ("nvlink", nvlink))
    )
    others = f"0 * group by ({by}) ({fam.UP} == 1)"
    return [
        Rule(GPU_LINK_LOAD, expr),
        Rule(GPU_LINK_ERRORS, f"sum by ({by}) ({link_error_counters()})"),
        # 0 for every other GPU up: the name is there whenever the rules run, so a page can tell "none" from "not
        # recorded" (``PAGE_NEEDS``)
        Rule(GPU_LINK_DEGRADED, f"(group by ({by}) ({link_degraded()})) or on (uuid) ({others})"),
        Rule(GPU_LINKS_UNSTEADY, links_unsteady(interval_s + 2 * scrape_s)),
    ]


def links_unsteady(window_s: int) -> str:
    """1 for each GPU whose count of active NVLinks changed within the last ``window_s`` (the rules' interval and two
    scrapes: consecutive evaluations' windows overlap, so no change between two samples falls between them, a missed
    scrape aside) or stands below the most of any GPU of its model; 0 for every other GPU with the count (the name is
    there whenever the rules run). ``link_outages`` reads link by link only the GPUs flagged in its range. A change
    is the window's largest count above its smallest: MetricsQL's ``changes()`` also counts a window's first sample
    where none came before it, which would flag every GPU of a new exporter (or of a replay's first evaluation) for
    as long as the range holds that evaluation."""
    count = fam.LINKS_ACTIVE
    changed = f"(max_over_time({count}[{window_s}s]) > min_over_time({count}[{window_s}s])) * 0 + 1"
    low = f"({fewer_links_active(count)}) * 0 + 1"
    return f"max by (node, gpu, uuid) (({changed}) or ({low}) or ({count} * 0))"


def link_degraded() -> str:
    """Every GPU whose links are degraded now, one series each (gpulens families): a PCIe generation or width below
    its maximum, or fewer NVLinks active than the most of any GPU of its model."""
    below = [f"{field_selector(f)} < on (uuid) {field_selector(f + '_max')}" for f in PCIE_LINK_SHAPE]
    return " or ".join(f"({part})" for part in [*below, fewer_links_active(field_selector("nvlink_links_active"))])


def link_error_counters() -> str:
    """One selector of every GPU's link error counters (gpulens families: each NVLink error type and PCIe replays):
    their names, and each constant label's values or none (a regex that matches "" matches a series without the
    label). An ``or`` of one selector per counter cost Prometheus half as much again."""
    counters = [s for f in LINK_ERROR_FIELDS for s in fam.sources(f) if not s.dcgm]
    values: dict[str, set[str]] = {}
    for source in counters:
        for key, value in source.labels:
            values.setdefault(key, set()).add(value)
    matchers = ", ".join(f"{key}=~{quote('|'.join(['', *sorted(v)]))}" for key, v in sorted(values.items()))
    return fam.selector({s.name for s in counters}, matchers)


def port_rules(scrape_s: int) -> list[Rule]:
    """The ports' problem flags, told as ``portproblems`` tells them from ``latest_nics``: down (``up`` 0), degraded
    (up, its width or rate below the best of its node's up ports of its link layer), saturated (up, a direction's
    rate over the reader's window at ``SATURATED_AT`` of its speed or more); errors (a counter's rate above 0)."""
    window = f"[{4 * scrape_s}s]"
    speed, width = NIC_FIELDS["rate_bytes_per_second"][0], NIC_FIELDS["link_width"][0]
    layer = f"max by ({_PORT}, link_layer) ({NIC_INFO})"
    up = f"({NIC_UP} == 1)"

    def of_up(family: str) -> str:
        return f"(max by ({_PORT}) ({family} > 0) * on ({_PORT}) group_left (link_layer) {layer} and on ({_PORT}) {up})"

    def below(family: str, factor: str) -> str:
        mine = of_up(family)
        return f"({mine} < on (node, link_layer) group_left () ({factor}max by (node, link_layer) ({mine})))"

    degraded = f"{below(f'round({width})', '')} or {below(speed, '0.99 * ')}"  # a width is read as a whole number
    saturated = " or ".join(
        f"(rate({NIC_FIELDS[f][0]}{window}) / on ({_PORT}) ({speed} > 0) >= {SATURATED_AT:g})"
        for f in ("transmit_bytes_per_second", "receive_bytes_per_second")
    )
    flags = " or ".join(
        [
            f'label_replace(max by ({_PORT}) ({NIC_UP} == bool 0), "bit", "down", "", "")',
            f'label_replace(2 * group by ({_PORT}) ({degraded}), "bit", "degraded", "", "")',
            f'label_replace(4 * group by ({_PORT}) (({saturated}) and on ({_PORT}) {up}), "bit", "saturated", "", "")',
        ]
    )
    # one counter at a time: a rate drops the name, so one selector of all three would collide
    errors = " or ".join(
        f'label_replace(rate({NIC_FIELDS[f][0]}{window}) > bool 0, "counter", "{f}", "", "")' for f in ERROR_FIELDS
    )
    return [
        Rule(PORT_FLAGS, f"sum by ({_PORT}) ({flags})"),
        Rule(PORT_ERRORS, f"max by ({_PORT}) ({errors})"),
    ]


def rules(interval_s: int = INTERVAL_S, scrape_s: int = SCRAPE_S) -> list[Rule]:
    clock = Rule(CLOCK, "vector(time())", (("interval", f"{interval_s}s"),))
    return [clock, *node_rules(), *job_rules(interval_s), *link_rules(interval_s, scrape_s), *port_rules(scrape_s)]


def names() -> tuple[str, ...]:
    """Every recorded name, in the file's order."""
    return tuple(r.record for r in rules())


def rules_yaml(interval_s: int = INTERVAL_S, scrape_s: int = SCRAPE_S) -> str:
    """The Prometheus rules file: one group evaluated every ``interval_s``, its rate windows 4 scrapes of
    ``scrape_s``."""
    if interval_s < 1 or scrape_s < 1:
        raise ValueError("the evaluation and scrape intervals must be at least 1 s")
    group = {
        "name": GROUP,
        "interval": f"{interval_s}s",
        "rules": [
            {"record": r.record, "expr": r.expr, **({"labels": dict(r.labels)} if r.labels else {})}
            for r in rules(interval_s, scrape_s)
        ],
    }
    head = (
        "# gpulens recording rules: gpulens rules export --format prometheus-recording (docs/prometheus-recording.md)\n"
        f"# Evaluated every {interval_s}s; rate windows {4 * scrape_s}s (4 scrapes of {scrape_s}s). Generated: do not "
        "edit.\n"
    )
    return head + yaml.safe_dump({"groups": [group]}, sort_keys=False, width=10_000)
