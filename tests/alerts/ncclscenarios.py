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


CHECKPOINT_JOB: Final = "ckpt"
CHECKPOINT_AT_S: Final = 20 * 60.0  # the first save: minutes 20 to 30 (one every 20 minutes, 10 minutes long)
CHECKPOINT_S: Final = 10 * 60.0


def checkpointing_job(
    *,
    deadlock_at: str | None = None,
    duration: str = "34m",
    nodes: int = 2,
    every: str = "20m",
    save: str = "10m",
    stuck_at: str | None = None,
) -> str:
    """A job over ``nodes`` nodes (two by default; 2 GPUs a node, NCCL 2.28.7) that saves a checkpoint from rank 0
    (``node-00:0``) alone for 10 minutes every 20 minutes: RAS shows rank 0 one operation behind for the whole save
    while its GPU copies to the host. ``deadlock_at``: rank 0 stops before a collective there, for 4 minutes, its GPU
    moving nothing. ``every`` and ``save``: another period and length of save; ``stuck_at``: the first save from then
    on never ends (its writer stuck in I/O, ``checkpoint_stuck_at``)."""
    fault = ""
    if deadlock_at is not None:
        fault = (
            f'\n[[faults]]\nkind = "hang_spinning"\njob = "{CHECKPOINT_JOB}"\nat = "{deadlock_at}"\nduration = "4m"\n'
            'stuck_ranks = ["node-00:0"]\n'
        )
    stuck = "" if stuck_at is None else f'\ncheckpoint_stuck_at = "{stuck_at}"'
    return f"""[cluster]
nodes = {nodes}
gpus_per_node = 2
gpu_model = "H100-SXM5-80GB"
seed = 9
start = "{START}"
duration = "{duration}"
step = "10s"

[[jobs]]
id = "{CHECKPOINT_JOB}"
user = "alice"
kind = "training"
gpus = [{", ".join(f'"node-{n:02d}:0-1"' for n in range(nodes))}]
checkpoint_every = "{every}"
checkpoint_duration = "{save}"
checkpoint_ranks = ["node-00:0"]{stuck}
nccl_version = "2.28.7"
{fault}"""
