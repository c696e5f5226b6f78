"""The typed shape of a scenario file: msgspec structs read by ``gpulens.typedinput`` (docs/scenarios.md).

These structs check what a type can: unknown keys, required keys, value types, GPU counts. ``[[faults]]`` tables
are the fault kinds' own structs (``exporter.sim.faults``), picked by their ``kind``. What needs the rest of the
scenario (node and job names, GPU ranges, durations and times, windows) is checked by ``exporter.sim.scenario``
when it resolves these into :class:`~exporter.sim.specs.Scenario`.
"""

from __future__ import annotations

from typing import Annotated, Final

from msgspec import Meta

from gpulens.typedinput import InputStruct

from .faults import AnyFaultParams
from .faults.base import DurationValue, TimeValue

MAX_GPUS_PER_NODE: Final = 64

GpuCount = Annotated[int, Meta(ge=1, le=MAX_GPUS_PER_NODE)]
NodeCount = Annotated[int, Meta(ge=1)]


class ClusterInput(InputStruct, frozen=True):
    """``[cluster]``."""

    nodes: NodeCount | list[str]
    gpus_per_node: GpuCount | None = None
    gpu_model: str | None = None
    seed: int = 0
    start: str | None = None  # TOML date-times arrive here as RFC 3339 text
    duration: DurationValue | None = None
    step: DurationValue | None = None


class NodeInput(InputStruct, frozen=True):
    """One ``[[nodes]]`` override."""

    name: str
    gpu_model: str | None = None
    gpus_per_node: GpuCount | None = None


class JobInput(InputStruct, frozen=True):
    """One ``[[jobs]]`` table."""

    id: str
    user: str
    kind: str
    gpus: str | list[str]
    start: TimeValue | None = None
    end: TimeValue | None = None
    memory_fraction: float | None = None
    checkpoint_every: DurationValue | None = None


class ScenarioInput(InputStruct, frozen=True):
    """A whole scenario file."""

    cluster: ClusterInput
    nodes: tuple[NodeInput, ...] = ()
    jobs: tuple[JobInput, ...] = ()
    faults: tuple[AnyFaultParams, ...] = ()
