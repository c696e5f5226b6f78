"""Scenarios whose causes overlap, for the incident layer's detection tests: each fault injected and the culprit the
incident must name. The check scenario (a GPU off the bus under a 16-node job) is examples/scenarios/gpu-lost.toml."""

from __future__ import annotations

from pathlib import Path
from typing import Final

GPU_LOST_EXAMPLE: Final = Path(__file__).resolve().parents[2] / "examples" / "scenarios" / "gpu-lost.toml"


def _header(nodes: int, model: str, seed: int, duration: str) -> str:
    return f"""
[cluster]
nodes = {nodes}
gpus_per_node = 8
gpu_model = "{model}"
seed = {seed}
start = "2026-01-01T00:00:00Z"
duration = "{duration}"
step = "10s"
"""


# A rank dies (its stall fires first) and its GPU reports an XID two minutes later: one incident, re-attributed.
XID_AFTER_STALL: Final = (
    _header(2, "H100-SXM5-80GB", 5, "25m")
    + """
[[jobs]]
id = "llm"
user = "alice"
kind = "training"
gpus = ["node-00:0-7", "node-01:0-7"]

[[faults]]
kind = "rank_dead"
gpu = "node-01:4"
at = "10m"

[[faults]]
kind = "xid"
gpu = "node-01:4"
xid = 48
at = "12m"
"""
)

# One InfiniBand port (A100 nodes: a NIC per two GPUs) goes down under two jobs: both stall, one incident.
LINK_UNDER_TWO_JOBS: Final = (
    _header(2, "A100-SXM4-80GB", 6, "25m")
    + """
[[jobs]]
id = "a"
user = "alice"
kind = "training"
gpus = ["node-00:2", "node-01:2"]

[[jobs]]
id = "b"
user = "bob"
kind = "training"
gpus = ["node-00:3", "node-01:3"]

[[faults]]
kind = "ib_link_down"
node = "node-00"
nic = "mlx5_1"
at = "8m"
duration = "10m"
"""
)

# Two faults in one job: a GPU throttles for heat, later another GPU of the job reports an XID: two incidents.
TWO_FAULTS_ONE_JOB: Final = (
    _header(1, "H100-SXM5-80GB", 8, "30m")
    + """
[[jobs]]
id = "ft"
user = "bob"
kind = "training"
gpus = ["node-00:0-7"]

[[faults]]
kind = "thermal_throttle"
gpu = "node-00:5"
at = "5m"
duration = "12m"

[[faults]]
kind = "xid"
gpu = "node-00:2"
xid = 48
at = "20m"
"""
)

# A node runs out of memory under a training job that spans it and another node: the job's loaders starve
# (JobInputBound), the node says why (HostMemoryPressure): one incident, its culprit the node.
MEMORY_STARVED: Final = (
    _header(3, "H100-SXM5-80GB", 9, "30m")
    + """
[[jobs]]
id = "loader"
user = "carol"
kind = "training"
gpus = ["node-01:0-7", "node-02:0-7"]

[[jobs]]
id = "bystander"
user = "dan"
kind = "training"
gpus = ["node-00:0-7"]

[[faults]]
kind = "host_memory_pressure"
node = "node-01"
at = "8m"
duration = "15m"
"""
)
