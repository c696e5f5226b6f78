"""History for the Prometheus bench: a simulated cluster's exporter series, written as OpenMetrics and turned into
TSDB blocks by ``promtool tsdb create-blocks-from openmetrics`` (the fast way to give a real Prometheus hours of
history of thousands of GPUs; scraping that many live would take as long as the history).

Every node exports what one gpulens exporter node exports (its series and labels taken from the exporter's own
``render_metrics`` of a simulated 8-GPU node: about 550 series per node), with the ``instance`` and ``job`` labels a
scrape adds and Prometheus's own ``up``/``scrape_*`` series per target. Values vary per GPU and per sample (gauges
within their range, counters growing); jobs hold whole nodes, one to four nodes each or half a node, and every third
group of nodes changes jobs halfway through the history (the series churn of real job turnover); one node in ten is
idle. Two links go down: link 5 of node 2's GPU 3 halfway through, link 0 of node 5's GPU 0 all along
(``LINK_FAULTS``). The same history is imported into a VictoriaMetrics through its Prometheus text import API
(``import_history``).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

TEMPLATE_NODE = "node-0000"
GPUS = 8
_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_CONSTANT = re.compile(
    r"_(info|up|link_active|throttle_active|links_active|pcie_link_generation|pcie_link_width|limit_watts|"
    r"total_bytes|max_clock_hertz|slowdown_temperature_celsius|remapped_rows\w*)$"
)
# NVLink outages: (node index, GPU) -> (link, first sample down; -1: the second half)
LINK_FAULTS = {(2, 3): (5, -1), (5, 0): (0, 0)}
_TARGET_SERIES = (("up", "1"), ("scrape_duration_seconds", "0.012"), ("scrape_samples_scraped", "553"))


@dataclass(frozen=True, slots=True)
class Layout:
    """Who holds which node when: ``jobs[node]`` is a list of (job id, user, GPUs, first sample, last sample)."""

    names: list[str]
    jobs: dict[str, list[tuple[str, str, range, int, int]]]
    idle: set[str]


def layout(nodes: int, samples: int) -> Layout:
    names = [f"node-{n:04d}" for n in range(nodes)]
    jobs: dict[str, list[tuple[str, str, range, int, int]]] = {n: [] for n in names}
    idle: set[str] = set()
    i = group = 0
    sizes = (1, 2, 4, 0)  # nodes per job; 0: two 4-GPU jobs share one node
    while i < nodes:
        size = sizes[group % len(sizes)]
        members = names[i : i + max(1, size)]
        turnover = group % 3 == 2
        halves = [(0, samples // 2 - 1, "a"), (samples // 2, samples - 1, "b")] if turnover else [(0, samples - 1, "")]
        if group % 10 == 9:
            idle |= set(members)
        else:
            for first, last, suffix in halves:
                user = f"user-{group % 37}"
                if size == 0:
                    jobs[members[0]] += [
                        (f"job-{group}{suffix}-{half}", user, range(4 * half, 4 * half + 4), first, last)
                        for half in (0, 1)
                    ]
                else:
                    for node in members:
                        jobs[node].append((f"job-{group}{suffix}", user, range(GPUS), first, last))
        i += len(members)
        group += 1
    return Layout(names, jobs, idle)


def template() -> list[tuple[str, str, str]]:
    """(name, labels, value) of every series one simulated 8-GPU gpulens exporter node exports, jobs left out."""
    from gpulens.exporter.metrics import ExporterHealth, render_metrics
    from gpulens.exporter.sim.cluster import SimCluster
    from gpulens.exporter.sim.scenario import parse_scenario

    scenario = parse_scenario(
        f'[cluster]\nnodes = ["{TEMPLATE_NODE}"]\ngpus_per_node = {GPUS}\ngpu_model = "H100-SXM5-80GB"\nseed = 3\n'
        'start = "2026-01-01T00:00:00Z"\nduration = "1h"\nstep = "10s"\n'
        f'[[jobs]]\nid = "x"\nuser = "u"\nkind = "training"\ngpus = ["{TEMPLATE_NODE}:0-{GPUS - 1}"]\n'
    )
    snapshot = SimCluster(scenario).snapshot(TEMPLATE_NODE, scenario.start + 600)
    out = []
    for line in render_metrics(snapshot, ExporterHealth()).decode().splitlines():
        match = _LINE.match(line)
        # the node's health is a state, not a reading to wobble; left out, every later series keeps the seed it has
        # always had (the port problems test compares flags that sit near their thresholds for some seeds)
        if (
            match is None
            or match.group(1) == "gpulens_gpu_job_info"
            or match.group(1).startswith("gpulens_node_health")
        ):
            continue
        out.append((match.group(1), match.group(2) or "", match.group(3)))
    return out


def _uuids(text: str, node_index: int) -> str:
    """The template's GPU UUIDs made this node's own (``GPU-<node>-...-<gpu>``)."""
    return re.sub(
        r'gpu="(\d+)",uuid="GPU-[0-9a-f-]+"',
        lambda m: f'gpu="{m.group(1)}",uuid="GPU-{node_index:08x}-0000-0000-0000-{int(m.group(1)):012x}"',
        text,
    )


def _values(name: str, base: float, seed: int, samples: int, idle: bool) -> Iterator[str]:
    if name.endswith("_total"):
        grow = max(1.0, abs(base) * 0.002) * (1 + seed % 5)
        return (f"{base + grow * k:.6g}" for k in range(samples))
    if _CONSTANT.search(name):
        text = f"{base:.6g}"
        return (text for _ in range(samples))
    level = 0.02 if idle and ("ratio" in name or "watts" in name or "bytes_per_second" in name) else 1.0
    top = 1.0 if name.endswith("_ratio") else float("inf")
    # a cheap deterministic wobble of +-15 % per sample
    return (
        f"{min(top, base * level * (0.85 + 0.3 * (((seed * 7919 + k * 104729) % 1000) / 1000))):.6g}"
        for k in range(samples)
    )


def _link_faults(name: str, labels: str, node: int, values: list[str], samples: int) -> list[str]:
    """``LINK_FAULTS`` applied to a link's state or a GPU's count of active links."""
    gpu = re.search(r'gpu="(\d+)"', labels)
    fault = LINK_FAULTS.get((node, int(gpu.group(1)) if gpu else -1))
    if fault is None:
        return values
    link, first = fault
    down = range(first if first >= 0 else samples // 2, samples)
    if name.endswith("links_active"):
        return [f"{float(v) - 1:g}" if k in down else v for k, v in enumerate(values)]
    if f'link="{link}"' not in labels:
        return values
    return ["0" if k in down else v for k, v in enumerate(values)]


class Writer(Protocol):
    def write(self, text: str, /) -> object: ...


def write_openmetrics(out: Writer, lay: Layout, start: int, step: int, samples: int, *, millis: bool = False) -> int:
    """Write every node's series over ``samples`` samples ``step`` seconds apart from ``start`` (each write whole
    lines; times in seconds, or milliseconds as the Prometheus text format has them if ``millis``); return the
    number of series written."""
    times = [str(start + k * step) + ("000" if millis else "") for k in range(samples)]
    rows = template()
    count = 0
    for n, node in enumerate(lay.names):
        scrape = f'instance="{node}:9410",job="gpulens"'
        for i, (name, labels, value) in enumerate(rows):
            own = _uuids(labels.replace(TEMPLATE_NODE, node), n)
            if name == "gpulens_process_gpu_memory_bytes":
                held = lay.jobs[node]
                if not held:
                    continue
                own = re.sub(r'job_id="[^"]*"', f'job_id="{held[-1][0]}"', own)
            prefix = f"{name}{{{own},{scrape}}} " if own else f"{name}{{{scrape}}} "
            values: Iterable[str] = _values(name, float(value), n * 1000 + i, samples, node in lay.idle)
            if name in ("gpulens_gpu_nvlink_link_active", "gpulens_gpu_nvlink_links_active"):
                values = _link_faults(name, labels, n, list(values), samples)
            out.write("".join(f"{prefix}{v} {t}\n" for v, t in zip(values, times, strict=True)))
            count += 1
        for job_id, user, gpus, first, last in lay.jobs[node]:
            for g in gpus:
                uuid = f"GPU-{n:08x}-0000-0000-0000-{g:012x}"
                prefix = (
                    f'gpulens_gpu_job_info{{node="{node}",gpu="{g}",uuid="{uuid}",job_id="{job_id}",user="{user}",'
                    f"{scrape}}} 1 "
                )
                out.write("".join(f"{prefix}{times[k]}\n" for k in range(first, last + 1)))
                count += 1
        for name, value in _TARGET_SERIES:
            out.write("".join(f"{name}{{{scrape}}} {value} {t}\n" for t in times))
            count += 1
    out.write("# EOF\n")
    return count


def create_blocks(promtool: str, work: Path, nodes: int, start: int, step: int, samples: int) -> int:
    """Write the history of ``nodes`` nodes as TSDB blocks under ``work / "tsdb"``; return the series count."""
    source = work / "history.om"
    with source.open("w", buffering=1 << 22) as out:
        count = write_openmetrics(out, layout(nodes, samples), start, step, samples)
    blocks_from_openmetrics(promtool, source, work / "tsdb")
    source.unlink()
    return count


def blocks_from_openmetrics(promtool: str, source: Path, tsdb: Path) -> None:
    """Write the OpenMetrics file ``source`` (samples with their timestamps, ``# EOF`` last) as TSDB blocks into
    ``tsdb`` (made if missing), for a Prometheus started on that directory."""
    tsdb.mkdir(exist_ok=True)
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb)],
        check=True,
        stdout=subprocess.DEVNULL,
    )


class _Importer:
    """Text written in whole lines, posted to VictoriaMetrics's ``/api/v1/import/prometheus`` a few MB at a time,
    one post in flight while the next is written."""

    CHUNK = 8 << 20

    def __init__(self, base: str) -> None:
        from concurrent.futures import Future, ThreadPoolExecutor

        self.base = base
        self.parts: list[str] = []
        self.size = 0
        self.pool = ThreadPoolExecutor(1)
        self.pending: Future[None] | None = None

    def _post(self, body: bytes) -> None:
        import urllib.request

        request = urllib.request.Request(f"{self.base}/api/v1/import/prometheus", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=600) as response:
            response.read()

    def write(self, text: str, /) -> int:
        self.parts.append(text)
        self.size += len(text)
        if self.size >= self.CHUNK:
            self.flush()
        return len(text)

    def flush(self) -> None:
        body = "".join(self.parts).encode()
        self.parts, self.size = [], 0
        if self.pending is not None:
            self.pending.result()
        self.pending = self.pool.submit(self._post, body)

    def close(self) -> None:
        self.flush()
        if self.pending is not None:
            self.pending.result()
        self.pool.shutdown()


def import_history(base: str, nodes: int, start: int, step: int, samples: int) -> int:
    """Import the history of ``nodes`` nodes into the VictoriaMetrics at ``base`` (the same series and samples as
    ``create_blocks`` writes), then make it searchable; return the series count."""
    import urllib.request

    importer = _Importer(base)
    try:
        count = write_openmetrics(importer, layout(nodes, samples), start, step, samples, millis=True)
    finally:
        importer.close()
    with urllib.request.urlopen(f"{base}/internal/force_flush", timeout=600) as response:
        response.read()
    return count


def backfill_rules(promtool: str, base: str, rules: Path, start: int, end: int, out: Path) -> None:
    """Evaluate the recording rules file ``rules`` over [start, end] against the Prometheus at ``base`` and write
    their series as TSDB blocks into ``out`` (``promtool tsdb create-blocks-from rules``: each rule evaluated at
    its group's interval, as a running Prometheus evaluates it); move them into a TSDB and restart Prometheus to
    serve them."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "rules",
            f"--url={base}",
            f"--start={start}",
            f"--end={end}",
            f"--output-dir={out}",
            str(rules),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def move_blocks(source: Path, tsdb: Path) -> int:
    """Move the TSDB blocks under ``source`` into ``tsdb``; return how many."""
    moved = 0
    for block in sorted(source.iterdir()):
        if block.is_dir() and (block / "meta.json").exists():
            block.rename(tsdb / block.name)
            moved += 1
    return moved


_COMMENT = re.compile(r"#[^\n]*\n")  # a page's HELP and TYPE lines ('#' starts no other line)
_UNLABELLED = re.compile(r"\n([a-zA-Z_:][a-zA-Z0-9_:]*) ")  # a sample without labels


def scenario_openmetrics(text: str, offset: float, step_s: float, *, leave_out: Iterable[str] = ()) -> Iterator[str]:
    """A simulator scenario's exporter pages (``text``: its TOML) every ``step_s`` as OpenMetrics text, a page at a
    time, ``offset`` seconds later, with the ``instance`` and ``job`` labels a scrape adds and the scrape's ``up``
    series (0 while the node's exporter does not answer, and none of its series then). Every family the exporter
    renders is there (the GPUs', the fabric's ``gpulens_nic_*``, the hosts', NCCL RAS's ``gpulens_nccl_*``) but the
    ``leave_out`` ones."""
    from gpulens.exporter.metrics import ExporterHealth, render_metrics
    from gpulens.exporter.sim import SimCluster, parse_scenario
    from gpulens.model import NodeUnavailableError

    scenario = parse_scenario(text)
    sim = SimCluster(scenario)
    names = "|".join(map(re.escape, leave_out))
    unwanted = re.compile(rf"\n(?:{names})[{{ ][^\n]*(?=\n)") if names else None
    k = 0
    while (t := scenario.start + k * step_s) < scenario.end - 1e-9:
        stamp = f"{t + offset:.3f}"
        for node in sim.node_names():
            scrape = f'instance="{node}:9410",job="gpulens"'
            try:
                page = render_metrics(sim.snapshot(node, t), ExporterHealth()).decode()
            except NodeUnavailableError:
                yield f"up{{{scrape}}} 0 {stamp}\n"
                continue
            page = _COMMENT.sub("", "\n" + page.rstrip("\n") + "\n")
            if unwanted is not None:
                page = unwanted.sub("", page)
            page = _UNLABELLED.sub(lambda m: f"\n{m.group(1)}{{}} ", page)[1:]
            page = page.replace("} ", f",{scrape}}} ").replace("{,", "{").replace("\n", f" {stamp}\n")
            yield f"up{{{scrape}}} 1 {stamp}\n" + page
        k += 1
