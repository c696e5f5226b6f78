"""The typed shape of a scenario file: msgspec structs, and :func:`read_input` that reads TOML into them.

The structs check what a type can: unknown keys, required keys, value types, GPU counts. ``[[faults]]`` tables are
the fault kinds' own structs (``gpulens.exporter.sim.faults``), picked by their ``kind``. Conversion goes through
``gpulens.typedinput``; its errors are reworded the scenario's way (a missing key at its own key, a key a fault kind
does not take). What needs the rest of the scenario (node and job names, GPU ranges, durations and times, windows)
is checked by ``exporter.sim.scenario`` when it resolves these into :class:`~gpulens.exporter.sim.specs.Scenario`
(docs/scenarios.md).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from datetime import date, datetime, time
from typing import Annotated, Any, Final

import msgspec
from msgspec import Meta

from gpulens.config import ConfigError, TomlLocator
from gpulens.exporter.sim.faults import FAULT_KINDS, AnyFaultParams
from gpulens.exporter.sim.faults.kind import DurationValue, TimeValue
from gpulens.exporter.sim.nics import MAX_NICS
from gpulens.typedinput import InputStruct, convert, dotted, split_path

MAX_GPUS_PER_NODE: Final = 64

_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column \d+\)")
_MISSING = re.compile(r"^object missing required field (\S+)$")

GpuCount = Annotated[int, Meta(ge=1, le=MAX_GPUS_PER_NODE)]
NodeCount = Annotated[int, Meta(ge=1)]
NicCount = Annotated[int, Meta(ge=1, le=MAX_NICS)]
NicRate = Annotated[float, Meta(gt=0, le=3200)]  # Gb/s


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
    nics: NicCount | None = None  # RDMA ports (default by GPU model, docs/scenarios.md)
    nic_rate_gbps: NicRate | None = None
    nic_link_layer: str | None = None  # "InfiniBand" or "Ethernet" (RoCE)


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
    checkpoint_duration: DurationValue | None = None
    checkpoint_ranks: str | list[str] | None = None  # GPU ranges that alone write, the others waiting one op ahead
    checkpoint_stuck_at: TimeValue | None = None  # the save from then on never ends: its writers stuck in I/O
    eval_every: DurationValue | None = None
    eval_duration: DurationValue | None = None
    first_step: DurationValue | None = None
    nccl_ras: bool = True  # false: NCCL older than 2.24, or RAS disabled
    nccl_version: str = "2.28.7"  # the NCCL its simulated RAS answers as (text before 2.28.7, JSON from it)
    nccl_inspector: bool = False  # its ranks run NCCL's Inspector (training jobs of two GPUs or more)


class ScenarioInput(InputStruct, frozen=True):
    """A whole scenario file."""

    cluster: ClusterInput
    nodes: tuple[NodeInput, ...] = ()
    jobs: tuple[JobInput, ...] = ()
    faults: tuple[AnyFaultParams, ...] = ()


_TABLES: Final[Mapping[str, type[msgspec.Struct]]] = {
    "": ScenarioInput,
    "cluster": ClusterInput,
    "nodes": NodeInput,
    "jobs": JobInput,
}
_TIME_KEYS: Final = (("cluster", ("start",)), ("jobs", ("start", "end")), ("faults", ("at",)))


def read_input(text: str, source: str) -> ScenarioInput:
    """Scenario TOML text -> :class:`ScenarioInput`; every problem is a ``ConfigError`` with file, key and line."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        m = _TOML_POSITION.search(message)
        line = int(m.group(1)) if m else None
        raise ConfigError(f"TOML syntax error: {_TOML_POSITION.sub('', message)}", file=source, line=line) from None
    locator = TomlLocator(text)
    if "cluster" not in data:
        raise ConfigError("missing the [cluster] table", file=source, key="cluster")
    _times_as_text(data, source, locator)
    try:
        return convert(data, ScenarioInput, text=text, source=source)
    except ConfigError as err:
        raise _explain(err, data, locator) from None


def _times_as_text(data: dict[str, Any], source: str, locator: TomlLocator) -> None:
    """TOML date-times become RFC 3339 text, the one form the structs read; a bare date or time is an error."""
    for table, keys in _TIME_KEYS:
        value = data.get(table)
        items = (
            [(None, value)] if isinstance(value, dict) else list(enumerate(value if isinstance(value, list) else []))
        )
        for index, item in items:
            for key in keys if isinstance(item, dict) else ():
                raw = item.get(key)
                if isinstance(raw, datetime):
                    item[key] = raw.isoformat()
                elif isinstance(raw, date | time):
                    where = table if index is None else f"{table}[{index}]"
                    raise ConfigError(
                        "expected an offset such as 20m or a full RFC 3339 time",
                        file=source,
                        key=f"{where}.{key}",
                        line=locator.line_of(table, index, key),
                    )


def _explain(err: ConfigError, data: Mapping[str, Any], locator: TomlLocator) -> ConfigError:
    """Say a conversion error the scenario's way: a missing key at its own dotted key, a fault key its kind does
    not take, an unknown fault kind, an unknown sub-table at its ``[header]``."""
    parts = split_path("." + (err.key or ""))
    message, line = err.message.replace(" | null", ""), err.line
    missing = _MISSING.match(message)
    if missing:
        parts = [*parts, missing.group(1)]
        message = "missing required key"
    elif len(parts) == 3 and parts[0] == "faults" and isinstance(parts[1], int) and isinstance(parts[2], str):
        table = data["faults"][parts[1]]
        kind = FAULT_KINDS.get(table.get("kind")) if isinstance(table.get("kind"), str) else None
        if parts[2] == "kind" and message.startswith("invalid value"):
            message = f"unknown kind {table['kind']!r} (expected one of: {', '.join(FAULT_KINDS)})"
        elif message == "unknown key" and kind is not None:
            message = kind.unknown_key(parts[2])
            if message == "unknown key":
                message += _expected(["kind", *(f.name for f in msgspec.structs.fields(kind.params))])
    elif message == "unknown key" and parts:
        struct = _TABLES.get(str(parts[0]) if len(parts) > 1 else "")
        message += _expected([f.name for f in msgspec.structs.fields(struct)] if struct else [])
    sub_table = all(isinstance(p, str) for p in parts) and isinstance(_at(data, parts), dict)
    if message.startswith("unknown key") and sub_table:  # point at its [header]
        line = locator.line_of(".".join(str(p) for p in parts)) or line
    return ConfigError(message, file=err.file, key=dotted(parts), line=line)


def _expected(keys: list[str]) -> str:
    return f" (expected one of: {', '.join(sorted(keys))})" if keys else ""


def _at(data: Any, parts: list[str | int]) -> Any:
    for part in parts:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data
