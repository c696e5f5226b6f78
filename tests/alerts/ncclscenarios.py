"""Simulator scenarios for NCCL RAS at job sizes and through checkpoints (issue 40): one training job over every
node, 2 GPUs a node, whose last rank stops before a collective or loses its process at ``FAULT_AT``."""

from __future__ import annotations

from typing import Final

from tests.alerts.scenarios import node

START: Final = "2026-01-01T00:00:00Z"
FAULT_AT_S: Final = 600.0
JOB: Final = "big"


def wide_job(nodes: int, signature: str, *, duration: str = "14m", version: str = "2.28.7", seed: int = 5) -> str:
    """A job of ``nodes`` nodes whose last rank (GPU 1 of the last node) is ``rank_missing`` (it stops before a
    collective the others wait in, for 4 minutes) or ``rank_dead`` (its process dies) from minute 10."""
    last = f"{node(nodes - 1, nodes)}:1"
    gpus = ", ".join(f'"{node(i, nodes)}:0-1"' for i in range(nodes))
    if signature == "rank_missing":
        fault = f'kind = "hang_spinning"\njob = "{JOB}"\nat = "10m"\nduration = "4m"\nstuck_ranks = ["{last}"]'
    elif signature == "rank_dead":
        fault = f'kind = "rank_dead"\ngpu = "{last}"\nat = "10m"'
    else:
        raise ValueError(f"no scenario for {signature!r}")
    return f"""[cluster]
nodes = {nodes}
gpus_per_node = 2
gpu_model = "H100-SXM5-80GB"
seed = {seed}
start = "{START}"
duration = "{duration}"
step = "10s"

[[jobs]]
id = "{JOB}"
user = "alice"
kind = "training"
gpus = [{gpus}]
nccl_version = "{version}"

[[faults]]
{fault}
"""
