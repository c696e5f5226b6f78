"""Simulator benchmark: one snapshot of every node of a 1,000-node x 8-GPU scenario.

The scenario mixes 100 eight-node training jobs (800 nodes), 800 single-GPU inference jobs (100 nodes), notebooks
and idle nodes. ``sim_snapshot_1000x8`` is the steady state: the next step after the previous snapshot, which is
what an exporter serving the cluster in (scaled) real time computes. ``sim_snapshot_1000x8_cold`` is the first
snapshot of a fresh cluster 25 minutes into the scenario: it also sums every GPU's energy, every RDMA port's
traffic and every job's CPU time over those 25 minutes. Each node's snapshot carries its 8 GPUs and, since issue 12,
its 8 RDMA ports (400 Gb/s InfiniBand, traffic from the training jobs that span nodes), its host and each job's
cgroup; ``sim_ports_1000x8`` counts the ports read per round.
"""

from __future__ import annotations

import sys
import time

from bench import options
from gpulens.exporter.sim import SimCluster, parse_scenario

NODES = 1000
MINUTE = 60.0


def scenario_text() -> str:
    lines = ["[cluster]", f"nodes = {NODES}", "gpus_per_node = 8", "seed = 3", 'duration = "2h"', 'step = "10s"']
    for j in range(100):
        gpus = ", ".join(f'"node-{n:03d}"' for n in range(8 * j, 8 * j + 8))
        lines += ["[[jobs]]", f'id = "train-{j}"', 'user = "u"', 'kind = "training"', f"gpus = [{gpus}]"]
        lines.append('checkpoint_every = "15m"')
    for n in range(800, 900):
        for g in range(8):
            lines += ["[[jobs]]", f'id = "serve-{n}-{g}"', 'user = "v"', 'kind = "inference"']
            lines.append(f'gpus = ["node-{n:03d}:{g}"]')
    for n in range(900, 950):
        lines += ["[[jobs]]", f'id = "nb-{n}"', 'user = "w"', 'kind = "notebook"', f'gpus = ["node-{n:03d}:0-1"]']
    return "\n".join(lines) + "\n"


def snapshot_all(sim: SimCluster, t: float) -> float:
    began = time.perf_counter()
    for node in sim.node_names():
        sim.snapshot(node, t)
    return time.perf_counter() - began


def ports(sim: SimCluster, t: float) -> int:
    return sum(len(sim.snapshot(node, t).nics) for node in sim.node_names())


def main() -> int:
    options.no_arguments(__spec__.name if __spec__ else __name__, __doc__)
    text = scenario_text()
    began = time.perf_counter()
    scenario = parse_scenario(text, source="bench")
    parsed = time.perf_counter() - began
    began = time.perf_counter()
    sim = SimCluster(scenario)
    built = time.perf_counter() - began
    print("# cold snapshot", file=sys.stderr)
    t = scenario.start + 25 * MINUTE  # between checkpoints: every training rank moves NVLink traffic
    cold = snapshot_all(sim, t)
    warm = []
    for i in range(1, 6):
        print(f"# steady snapshot {i}", file=sys.stderr)
        warm.append(snapshot_all(sim, t + i * scenario.step_s))
    best = min(warm)
    print(f"sim_scenario_parse_1000x8: {parsed * 1000:.0f} ms")
    print(f"sim_cluster_build_1000x8: {built * 1000:.0f} ms")
    print(f"sim_snapshot_1000x8_cold: {cold:.2f} s")
    print(f"sim_snapshot_1000x8: {best:.2f} s")
    print(f"sim_snapshot_per_node: {best / NODES * 1000:.2f} ms")
    print(f"sim_ports_1000x8: {ports(sim, t + 5 * scenario.step_s)} ports")
    return 0


if __name__ == "__main__":
    sys.exit(main())
