"""Scenario files for detection tests: every fault kind and every confounder, at any cluster size, model and seed.

``job_faults`` puts one training job of a chosen shape (``TOPOLOGIES``) through a communication stall, a straggler
and (on NVLink models) an NVLink saturation, on a cluster whose other GPUs hold the confounders. ``hangs`` puts
three jobs of that shape through the three hang signatures (spinning, blocked, mixed) beside the confounders.
``gpu_faults`` puts each GPU-, node- and job-scoped hardware fault on its own target in its own window. ``healthy``
holds only confounders: training with data-loader pauses and checkpoints, jobs that start and end mid-run, single- and
multi-GPU inference, notebooks, idle GPUs, a node with dead profiling counters; ``phases`` adds the training phases
that look like part of a hang: checkpoints of up to 15 minutes, evaluation phases, a slow first step.
``fabric_faults`` puts every fabric and host fault kind on its own port, node or job, beside the fabric's
confounders (a job on one node with no fabric traffic, checkpoints written over the fabric, a job that never spans
nodes). ``hardware_faults`` loses a GPU before the agent starts, stops an NVSwitch node's fabric manager and
unloads nvidia_peermem on a node, beside the healthy confounders.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from gpulens.exporter.sim import CATALOGUE

MODELS: Final = ("H100-SXM5-80GB", "A100-SXM4-80GB", "H200-SXM-141GB", "L40S")
TOPOLOGIES: Final = ("pair", "node", "two-node", "wide", "spread", "all")
GPUS_PER_NODE: Final = 8


def node(i: int, nodes: int) -> str:
    width = max(2, len(str(nodes - 1)))
    return f"node-{i:0{width}d}"


def _header(nodes: int, model: str, seed: int, duration: str, step: str = "10s") -> list[str]:
    return [
        "[cluster]",
        f"nodes = {nodes}",
        f"gpus_per_node = {GPUS_PER_NODE}",
        f'gpu_model = "{model}"',
        f"seed = {seed}",
        'start = "2026-01-01T00:00:00Z"',
        f'duration = "{duration}"',
        f'step = "{step}"',
    ]


def _job(job_id: str, kind: str, gpus: list[str], user: str = "u", **extra: str) -> list[str]:
    quoted = ", ".join(f'"{g}"' for g in gpus)
    lines = ["", "[[jobs]]", f'id = "{job_id}"', f'user = "{user}"', f'kind = "{kind}"', f"gpus = [{quoted}]"]
    lines += [f'{key} = "{value}"' for key, value in extra.items()]
    return lines


def _fault(
    kind: str, target_key: str, target: str, at: str, duration: str | None = None, **extra: int | str | list[str]
) -> list[str]:
    lines = ["", "[[faults]]", f'kind = "{kind}"', f'{target_key} = "{target}"', f'at = "{at}"']
    if duration is not None:
        lines.append(f'duration = "{duration}"')
    for key, value in extra.items():
        if isinstance(value, list):
            listed = ", ".join(f'"{v}"' for v in value)
            lines.append(f"{key} = [{listed}]")
        elif isinstance(value, str):
            lines.append(f'{key} = "{value}"')
        else:
            lines.append(f"{key} = {value}")
    return lines


def _topology_gpus(topology: str, nodes: int) -> dict[str, list[int]]:
    """The target job's GPUs by node."""
    all_gpus = list(range(GPUS_PER_NODE))
    if topology == "pair":
        return {node(0, nodes): [0, 1]}
    if topology == "node":
        return {node(0, nodes): all_gpus}
    if topology == "two-node":
        return {node(0, nodes): all_gpus, node(1, nodes): all_gpus}
    if topology == "wide":
        return {node(i, nodes): [0, 1, 2, 3] for i in range(min(4, nodes))}
    if topology == "spread":
        return {node(i, nodes): [0] for i in range(min(4, nodes))}
    if topology == "all":
        return {node(i, nodes): all_gpus for i in range(nodes)}
    raise ValueError(f"unknown topology {topology!r}")


def _background(
    nodes: int, used: dict[str, list[int]], start_node: int = 0, end_node: int | None = None
) -> Iterator[list[str]]:
    """Confounder jobs on every GPU of nodes ``start_node`` up to ``end_node`` that ``used`` does not hold."""
    for i in range(start_node, nodes if end_node is None else end_node):
        name = node(i, nodes)
        free = [g for g in range(GPUS_PER_NODE) if g not in used.get(name, [])]
        if not free:
            continue
        if len(free) < GPUS_PER_NODE:  # the target's node: single-GPU inference on what is left
            for g in free:
                yield _job(f"serve-{name}-{g}", "inference", [f"{name}:{g}"], user="svc")
            continue
        template = i % 4
        if template == 0:
            yield _job(
                f"train-{name}", "training", [f"{name}:0-7"], start="3m", end="38m", checkpoint_every="5m"
            )  # starts and ends mid-run, checkpoints often
        elif template == 1:
            for g in range(6):
                yield _job(f"serve-{name}-{g}", "inference", [f"{name}:{g}"], user="svc")
            yield _job(f"multi-serve-{name}", "inference", [f"{name}:6-7"], user="svc")  # multi-GPU inference
        elif template == 2:
            yield _job(f"nb-{name}", "notebook", [f"{name}:0"], user="carol")
            yield _job(f"nb2-{name}", "notebook", [f"{name}:0"], user="dan")  # two notebooks share a GPU
            yield _job(f"late-{name}", "training", [f"{name}:2-5"], start="20m")  # starts mid-run
        else:
            yield _job(f"dp-{name}", "training", [f"{name}:0-7"], checkpoint_every="6m")
            yield _fault("dead_profiling", "node", name, "5m")


def job_faults(nodes: int, model: str, seed: int, topology: str, step: str = "10s") -> str:
    """A training job of shape ``topology`` stalls (10m-18m), straggles (22m-30m) and saturates NVLink (34m-40m)."""
    gpus = _topology_gpus(topology, nodes)
    lines = _header(nodes, model, seed, "45m", step)
    specs = [f"{n}:{','.join(map(str, g))}" for n, g in gpus.items()]
    lines += _job("target", "training", specs, user="alice", checkpoint_every="7m")
    for chunk in _background(nodes, gpus):
        lines += chunk
    first_node = next(iter(gpus))
    straggler = f"{first_node}:{gpus[first_node][-1]}"
    lines += _fault("comm_stall", "job", "target", "10m", "8m")
    lines += _fault("straggler", "gpu", straggler, "22m", "8m")
    if CATALOGUE[model].has_nvlink and max(len(g) for g in gpus.values()) >= 2:
        lines += _fault("nvlink_saturation", "job", "target", "34m", "6m")
    return "\n".join(lines) + "\n"


def _hang_shapes(topology: str, nodes: int) -> list[dict[str, list[int]]]:
    """Three jobs of shape ``topology`` on disjoint GPUs: side by side on the nodes when there are enough, otherwise
    on other GPUs of the same nodes."""
    one = _topology_gpus(topology, nodes)
    span = max(int(n.removeprefix("node-")) for n in one) + 1
    if 3 * span <= nodes:
        return [{node(int(n.removeprefix("node-")) + k * span, nodes): g for n, g in one.items()} for k in range(3)]
    width = max(len(g) for g in one.values())
    if 3 * width > GPUS_PER_NODE:
        raise ValueError(f"no room for three {topology} jobs on {nodes} nodes")
    return [{n: [i + k * width for i in range(width)] for n in one} for k in range(3)]


def hangs(nodes: int, model: str, seed: int, topology: str, step: str = "10s") -> str:
    """Three training jobs of shape ``topology`` hang at 15m for 25m, one per signature: spinning, blocked, and mixed
    (the first half of its GPUs idle); the rest of the cluster holds confounders (50 minutes)."""
    lines = _header(nodes, model, seed, "50m", step)
    used: dict[str, list[int]] = {}
    faults: list[str] = []
    for shape, signature in zip(_hang_shapes(topology, nodes), ("spinning", "blocked", "mixed"), strict=True):
        for name, g in shape.items():
            used.setdefault(name, []).extend(g)
        job = f"hang-{signature}"
        lines += _job(
            job, "training", [f"{n}:{','.join(map(str, g))}" for n, g in shape.items()], checkpoint_every="6m"
        )
        gpus = [f"{n}:{i}" for n, g in shape.items() for i in g]
        extra: dict[str, list[str]] = {"ranks": gpus[: len(gpus) // 2]} if signature == "mixed" else {}
        faults += _fault(f"hang_{signature}", "job", job, "15m", "25m", **extra)
    for chunk in _background(nodes, used):
        lines += chunk
    return "\n".join(lines + faults) + "\n"


def _nccl(version: str, ras: bool) -> list[str]:
    return [f'nccl_version = "{version}"', f"nccl_ras = {'true' if ras else 'false'}"]


def nccl_hangs(nodes: int, model: str, seed: int, topology: str, version: str = "2.28.7", ras: bool = True) -> str:
    """``hangs`` with NCCL RAS: each hang names its last GPU in ``stuck_ranks``, and a fourth job (two GPUs of the
    last node) loses a rank's process (``rank_dead``) at 15m; every training job answers RAS as NCCL ``version``
    (or not at all, ``ras=False``). 50 minutes."""
    lines = _header(nodes, model, seed, "50m")
    used: dict[str, list[int]] = {}
    faults: list[str] = []
    for shape, signature in zip(_hang_shapes(topology, nodes), ("spinning", "blocked", "mixed"), strict=True):
        for name, g in shape.items():
            used.setdefault(name, []).extend(g)
        job = f"hang-{signature}"
        gpus = [f"{n}:{i}" for n, g in shape.items() for i in g]
        lines += _job(
            job, "training", [f"{n}:{','.join(map(str, g))}" for n, g in shape.items()], checkpoint_every="6m"
        )
        lines += _nccl(version, ras)
        extra: dict[str, list[str]] = {"stuck_ranks": gpus[-1:]}
        if signature == "mixed":
            extra["ranks"] = gpus[: len(gpus) // 2]
        faults += _fault(f"hang_{signature}", "job", job, "15m", "25m", **extra)
    last = node(nodes - 1, nodes)
    free = [i for i in range(GPUS_PER_NODE) if i not in used.get(last, [])][:2]
    used.setdefault(last, []).extend(free)
    lines += _job("rank-dead", "training", [f"{last}:{free[0]},{free[1]}"], checkpoint_every="6m")
    lines += _nccl(version, ras)
    faults += _fault("rank_dead", "gpu", f"{last}:{free[1]}", "15m")
    for chunk in _background(nodes, used):
        lines += chunk
    return "\n".join(lines + faults) + "\n"


def gpu_faults(nodes: int, model: str, seed: int) -> str:
    """Every GPU-, node- and job-scoped hardware fault, each on its own target in its own window (50 minutes)."""
    n0, n1, last = node(0, nodes), node(1, nodes), node(nodes - 1, nodes)
    lines = _header(nodes, model, seed, "50m")
    for g in (0, 1, 2, 4, 5, 6):
        lines += _job(f"serve-{g}", "inference", [f"{n0}:{g}"], user="svc")
    lines += _job("train", "training", [f"{n1}:0-5"], user="alice", checkpoint_every="10m")
    lines += _job("forgotten", "inference", [f"{n1}:6-7"], user="dave")
    for chunk in _background(nodes, {}, start_node=2):
        lines += chunk
    lines += _fault("memory_leak", "gpu", f"{n0}:0", "5m", "20m")
    lines += _fault("thermal_throttle", "gpu", f"{n0}:1", "10m", "10m")
    lines += _fault("power_cap", "gpu", f"{n0}:2", "15m", "15m")
    lines += _fault("pcie_degraded", "gpu", f"{n0}:3", "5m")  # an idle GPU: its width gives it away
    lines += _fault("pcie_saturation", "gpu", f"{n0}:4", "20m", "10m")
    lines += _fault("xid", "gpu", f"{n0}:5", "12m", xid=79)
    lines += _fault("xid", "gpu", f"{n0}:6", "14m", xid=13)  # an application error: not paged on
    lines += _fault("xid", "gpu", f"{n0}:7", "30m", xid=79)  # the GPU falls off the bus: the kernel log still says so
    lines += _fault("gpu_lost", "gpu", f"{n0}:7", "30m")
    lines += _fault("kernel_xid", "gpu", f"{n1}:4", "16m", xid=119)  # NVML silent: the kernel log alone
    lines += _fault("xid", "gpu", f"{n1}:5", "18m", xid=31)  # an application fault: no alert
    lines += _fault("sxid", "node", n1, "22m", sxid=24007)  # NvswitchFatalSxid on the node, no GPU alert
    lines += _fault("power_cap", "gpu", f"{n1}:3", "32m", "10m")  # a capped rank among training peers
    if CATALOGUE[model].has_nvlink:
        lines += _fault("nvlink_errors", "gpu", f"{n1}:2", "20m", "5m")
    lines += _fault("dead_profiling", "node", n1, "25m")
    lines += _fault("idle_allocated", "job", "forgotten", "5m")
    lines += _fault("exporter_down", "node", last, "36m", "5m")
    lines += _fault("nvml_hang", "node", last, "10m", "8m")  # the driver wedges: the exporter still answers
    return "\n".join(lines) + "\n"


def healthy(nodes: int, model: str, seed: int, pcie_node: bool = True) -> str:
    """Only confounders (45 minutes); with ``pcie_node`` the last node is an L40S box with PCIe-only training."""
    lines = _header(nodes, model, seed, "45m")
    last = node(nodes - 1, nodes)
    if pcie_node and nodes > 1:
        lines += ["", "[[nodes]]", f'name = "{last}"', 'gpu_model = "L40S"']
    lines += _job("train", "training", [f"{node(0, nodes)}:0-7"], user="alice", checkpoint_every="5m")
    end = nodes - 1 if pcie_node and nodes > 1 else nodes
    for chunk in _background(nodes, {node(0, nodes): list(range(8))}, start_node=1, end_node=end):
        lines += chunk
    if pcie_node and nodes > 1:
        lines += _job("pcie-train", "training", [f"{last}:0-5"], user="erin", checkpoint_every="8m")
        lines += _job("pcie-serve", "inference", [f"{last}:6"], user="svc")
    return "\n".join(lines) + "\n"


_PHASES: Final = (
    {"checkpoint_every": "25m", "checkpoint_duration": "15m"},
    {"eval_every": "10m", "eval_duration": "4m", "checkpoint_every": "20m"},
    {"first_step": "20m", "checkpoint_every": "15m", "checkpoint_duration": "5m"},
    {
        "first_step": "8m",
        "checkpoint_every": "30m",
        "checkpoint_duration": "15m",
        "eval_every": "12m",
        "eval_duration": "3m",
    },
)


def phases(nodes: int, model: str, seed: int, step: str = "10s") -> str:
    """Healthy training phases that look like part of a hang (80 minutes): checkpoints of 15 minutes, evaluation
    phases with little traffic, a slow first step. One job per node, the phases taking turns; with three or more
    nodes nodes 1-2 hold one two-node job with the long checkpoints; with two or more the last node is PCIe-only."""
    lines = _header(nodes, model, seed, "80m", step)
    last = node(nodes - 1, nodes)
    if nodes > 1:
        lines += ["", "[[nodes]]", f'name = "{last}"', 'gpu_model = "L40S"']
    i = 0
    while i < nodes:
        name = node(i, nodes)
        if i == 1 and nodes >= 4:
            gpus = [f"{name}:0-7", f"{node(2, nodes)}:0-7"]
            lines += _job("phases-multi", "training", gpus, **_PHASES[0])
            i += 2
            continue
        template = _PHASES[3] if name == last and nodes > 1 else _PHASES[i % len(_PHASES)]
        lines += _job(f"phases-{name}", "training", [f"{name}:0-7"], **template)
        i += 1
    return "\n".join(lines) + "\n"


# The simulator's RDMA ports per node by GPU model (HGX: one per GPU; DGX A100: one per GPU pair; L40S: two RoCE).
NICS_PER_NODE: Final = {"H100-SXM5-80GB": 8, "H200-SXM-141GB": 8, "A100-SXM4-80GB": 4, "L40S": 2}


def nic_of(model: str, gpu: int) -> str:
    """The port next to GPU ``gpu`` on a node of ``model`` (the simulator shares the GPUs out in order)."""
    return f"mlx5_{gpu * NICS_PER_NODE[model] // GPUS_PER_NODE}"


def fabric_faults(nodes: int, model: str, seed: int, step: str = "10s", by_job: bool = False) -> str:
    """Every fabric and host fault kind on its own target (60 minutes, 4 nodes or more).

    A two-node job ``multi`` (node 0 and 1, all GPUs) loses a port (5m-13m: it hangs), sees another flap three times
    (20m-26m), starves for CPU (32m-42m) and runs its ports at line rate (46m-54m); a two-node job ``pair`` (GPUs 0-3
    of nodes 2 and 3) runs through congestion (25m-35m) and memory pressure on node 2 (45m-55m), with ``solo`` (GPUs
    4-7 of node 2, never spanning nodes, checkpointing over the fabric); one port has climbing errors (10m-20m),
    another trains at half its rate (15m-30m). With ``by_job`` the link-down and congestion faults name the job
    instead of one port.
    """
    if nodes < 4:
        raise ValueError("fabric_faults needs 4 nodes or more")
    n0, n1, n2, n3 = (node(i, nodes) for i in range(4))
    lines = _header(nodes, model, seed, "60m", step)
    lines += _job("multi", "training", [f"{n0}:0-7", f"{n1}:0-7"], user="alice", checkpoint_every="9m")
    lines += _job("pair", "training", [f"{n2}:0-3", f"{n3}:0-3"], user="bob", checkpoint_every="8m")
    lines += _job("solo", "training", [f"{n2}:4-7"], user="carol", checkpoint_every="6m")
    lines += _job("serve", "inference", [f"{n3}:4"], user="svc")
    lines += _job("nb", "notebook", [f"{n3}:5"], user="dan")
    for chunk in _background(nodes, {}, start_node=4):
        lines += chunk
    if by_job:
        lines += _fault("ib_link_down", "job", "multi", "5m", "8m")
    else:
        lines += _fault("ib_link_down", "node", n1, "5m", "8m", nic=nic_of(model, 2))
    lines += _fault("ib_errors", "node", n2, "10m", "10m", nic=nic_of(model, 6))
    lines += _fault("ib_degraded", "node", n3, "15m", "15m", nic=nic_of(model, 7))
    lines += _fault("ib_link_flap", "node", n0, "20m", "6m", nic=nic_of(model, 5), count=3)
    if by_job:
        lines += _fault("fabric_congestion", "job", "pair", "25m", "10m")
    else:
        lines += _fault("fabric_congestion", "node", n2, "25m", "10m", nic=nic_of(model, 0))
    lines += _fault("host_cpu_contention", "job", "multi", "32m", "10m")
    lines += _fault("host_memory_pressure", "node", n2, "45m", "10m")
    lines += _fault("fabric_saturation", "job", "multi", "46m", "8m")
    return "\n".join(lines) + "\n"


def hardware_faults(nodes: int, model: str, seed: int) -> str:
    """A GPU missing from the start (no job holds it), on NVSwitch models a fabric not ready (15 minutes) and on nodes
    with RDMA ports nvidia_peermem missing (25 minutes); every other GPU holds a confounder (40 minutes)."""
    n0, n1, last = node(0, nodes), node(1, nodes), node(nodes - 1, nodes)
    lines = _header(nodes, model, seed, "40m")
    for chunk in _background(nodes, {n0: [7]}):
        lines += chunk
    lines += _fault("gpu_missing", "gpu", f"{n0}:7", "0s")
    if CATALOGUE[model].nvswitches:
        lines += _fault("fabric_not_ready", "node", n1, "10m", "15m")
    lines += _fault("peermem_missing", "node", last, "5m", "25m")
    return "\n".join(lines) + "\n"
