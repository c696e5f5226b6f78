"""The snapshot codec: ``NodeSnapshot`` to and from the ``/api/v1/snapshot`` JSON document (docs/snapshot.md).

Two layouts of schema 2 are written: ``rows`` (each record one JSON object, the default) and ``columnar`` (each
section one ``{"columns": [...], "rows": [[...], ...]}`` table, which the collector asks for). Schema-1 documents
and both layouts are read. Decoding is msgspec's: the text is parsed and every value type-checked in C against
structs derived from the records in ``gpulens.model`` and ``gpulens.fabricmodel``, and the frozen records are built
in C too (``msgspec.convert(..., from_attributes=True)``); no value passes through a Python type check. Any error
is a ``SnapshotFormatError`` whose message starts with the field's path (``gpus[0].memory_used_bytes: ...``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgspec
import orjson

from gpulens.fabricmodel import HostReading, JobHostReading, NicReading
from gpulens.model import (
    LINK_SCOPES,
    LINKS_ALL,
    GpuJob,
    GpuReading,
    JobInfo,
    LinkReading,
    MigReading,
    NodeSnapshot,
    ProcessReading,
    SnapshotFormatError,
)
from gpulens.ncclinspect import InspectorView
from gpulens.ncclmodel import NcclView
from gpulens.nodehardware import NodeHardware
from gpulens.nodehealth import node_health

# Schema 2 added the ``nics`` and ``host`` sections; schema-1 documents (older exporters) are still read.
SNAPSHOT_SCHEMA: Final = 2
SNAPSHOT_SCHEMAS_READ: Final = (1, 2)
LAYOUT_ROWS: Final = "rows"
LAYOUT_COLUMNAR: Final = "columnar"
LAYOUTS: Final = (LAYOUT_ROWS, LAYOUT_COLUMNAR)

# Links are many (18 per H100) and alike, so even the row layout carries them as rows of these columns; a link's
# node and uuid are those of its GPU (the row's ``gpu`` index).
LINK_COLUMNS: Final = ("gpu", "link", "active", "tx_bytes_per_second", "rx_bytes_per_second", "remote_pci_bus_id")

# Old key -> the field's name now, for keys that exporters before a rename wrote (row layout only).
_OLD_PROCESS_KEYS: Final = {"used_memory_bytes": "memory_used_bytes"}


class SnapshotNotJSONError(SnapshotFormatError):
    """The bytes are not JSON at all (truncated, not text, ...)."""


# --- encoding --------------------------------------------------------------------------------------------------


@functools.cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _record_to_json(record: Any) -> dict[str, Any]:
    """A record as a JSON object; ``None`` values are left out (absent and null both mean "not read")."""
    out: dict[str, Any] = {}
    cls: type = type(record)
    for name in _names(cls):
        value = getattr(record, name)
        if value is None:
            continue
        if name == "xid_errors":
            if not value:
                continue
            value = {str(k): v for k, v in value.items()}
        elif isinstance(value, tuple):
            if not value:
                continue
            value = list(value)
        out[name] = value
    return out


def _without_node(obj: dict[str, Any]) -> dict[str, Any]:
    obj.pop("node", None)
    return obj


@functools.cache
def _table_columns(cls: type, implied: tuple[str, ...]) -> tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]:
    columns = LINK_COLUMNS if cls is LinkReading else tuple(n for n in _names(cls) if n not in implied)
    return columns, operator.attrgetter(*columns)


def _table(cls: type, records: Sequence[Any], implied: tuple[str, ...] = ("node",)) -> dict[str, Any]:
    """Records as one columnar table; ``implied`` fields (the node) are the document's and left out."""
    columns, row = _table_columns(cls, implied)
    rows: list[Any] = [row(r) for r in records]
    if cls is GpuReading:
        xid = columns.index("xid_errors")
        for i, r in enumerate(records):
            if r.xid_errors:  # JSON object keys are strings
                cells = list(rows[i])
                cells[xid] = {str(k): v for k, v in r.xid_errors.items()}
                rows[i] = cells
    return {"columns": list(columns), "rows": rows}


def _host_to_json(snapshot: NodeSnapshot) -> dict[str, Any] | None:
    if snapshot.host is None and not snapshot.job_hosts:
        return None
    host = _without_node(_record_to_json(snapshot.host)) if snapshot.host is not None else {}
    host["jobs"] = [_without_node(_record_to_json(j)) for j in snapshot.job_hosts]
    return host


def snapshot_to_json(
    snapshot: NodeSnapshot, health: Mapping[str, Any] | None = None, *, layout: str = LAYOUT_ROWS
) -> dict[str, Any]:
    """The ``/api/v1/snapshot`` document (schema 2) in ``layout``. ``health`` is the exporter's own state.

    Schema 2 adds ``nics`` (one object per RDMA port, without its ``node``) and ``host`` (the node's CPUs and
    memory, with ``jobs``: each job's share of the host, without ``node``); ``host`` is null where not read."""
    doc: dict[str, Any] = {
        "schema": SNAPSHOT_SCHEMA,
        "layout": layout,
        "node": snapshot.node,
        "time": snapshot.timestamp,
        "source": snapshot.source,
        "driver_version": snapshot.driver_version,
    }
    if layout == LAYOUT_ROWS:
        doc["gpus"] = [_record_to_json(g) for g in snapshot.gpus]
        doc["link_columns"] = list(LINK_COLUMNS)
        doc["links"] = [[getattr(link, c) for c in LINK_COLUMNS] for link in snapshot.links]
        doc["processes"] = [_record_to_json(p) for p in snapshot.processes]
        doc["jobs"] = [_record_to_json(j) for j in snapshot.jobs]
        doc["job_info"] = [_record_to_json(j) for j in snapshot.job_info]
        doc["migs"] = [_record_to_json(m) for m in snapshot.migs]
        doc["nics"] = [_without_node(_record_to_json(n)) for n in snapshot.nics]
    elif layout == LAYOUT_COLUMNAR:
        doc["gpus"] = _table(GpuReading, snapshot.gpus)
        doc["links"] = _table(LinkReading, snapshot.links, ("node", "uuid"))
        doc["processes"] = _table(ProcessReading, snapshot.processes)
        doc["jobs"] = _table(GpuJob, snapshot.jobs)
        doc["job_info"] = _table(JobInfo, snapshot.job_info)
        doc["migs"] = _table(MigReading, snapshot.migs)
        doc["nics"] = _table(NicReading, snapshot.nics)
    else:
        raise ValueError(f"unknown snapshot layout {layout!r}; expected one of {', '.join(LAYOUTS)}")
    if snapshot.links_scope != LINKS_ALL:  # only the inactive links: said, so that no reader takes it for all
        doc["links_scope"] = snapshot.links_scope
    doc["host"] = _host_to_json(snapshot)
    if snapshot.nccl is not None:  # the same object in both layouts: a few ranks at most
        doc["nccl"] = msgspec.to_builtins(snapshot.nccl)
    if snapshot.inspector is not None:  # the same object in both layouts: at most MAX_SERIES series
        doc["inspector"] = msgspec.to_builtins(snapshot.inspector)
    if snapshot.hardware is not None:  # the same object in both layouts: a few values and one entry per GPU
        doc["hardware"] = msgspec.to_builtins(snapshot.hardware)
    doc["errors"] = dict(snapshot.errors)
    if snapshot.stale:  # only where a part is late: a fresh document is unchanged
        doc["stale"] = dict(snapshot.stale)
    if snapshot.nvml_hung_since is not None:
        doc["nvml_hung_since"] = snapshot.nvml_hung_since
    doc["health"] = node_health(snapshot).to_json()  # the node's (gpulens.nodehealth); decoding reads it again
    if health is not None:
        doc["exporter"] = dict(health)
    return doc


def snapshot_to_bytes(
    snapshot: NodeSnapshot, health: Mapping[str, Any] | None = None, *, layout: str = LAYOUT_ROWS
) -> bytes:
    """:func:`snapshot_to_json` as JSON text (orjson: fast enough for one process serving 1,000 simulated nodes)."""
    return orjson.dumps(snapshot_to_json(snapshot, health, layout=layout))


# --- decoding: structs derived from the records --------------------------------------------------------------


def _field_spec(f: dataclasses.Field[Any], hints: Mapping[str, Any]) -> tuple[Any, ...]:
    if f.default is not dataclasses.MISSING:
        return (f.name, hints[f.name], f.default)
    if f.default_factory is not dataclasses.MISSING:
        return (f.name, hints[f.name], msgspec.field(default_factory=f.default_factory))
    return (f.name, hints[f.name])


def _object_struct(cls: type, *, node_implied: bool, extra: Sequence[tuple[Any, ...]] = ()) -> Any:
    """A struct with ``cls``'s fields, read from a JSON object; ``node`` is optional where the document implies it."""
    hints = typing.get_type_hints(cls)
    fields = [
        ("node", str, "") if node_implied and f.name == "node" else _field_spec(f, hints)
        for f in dataclasses.fields(cls)
    ]
    return msgspec.defstruct(f"{cls.__name__}Object", [*fields, *extra], kw_only=True, gc=False)


class _RowType(typing.NamedTuple):
    columns: tuple[str, ...]
    decoder: msgspec.json.Decoder[Any]
    implied: tuple[str, ...]  # fields not among the columns that the document supplies (node, a link's uuid)


@functools.lru_cache(maxsize=256)  # bounded: the column lists come from the documents
def _row_type(cls: type, columns: tuple[str, ...], implied: tuple[str, ...], section: str) -> _RowType:
    """A decoder of rows of ``columns`` (each a JSON array) for records ``cls``; raises for a bad column list."""
    hints = typing.get_type_hints(cls)
    if len(set(columns)) != len(columns):
        raise SnapshotFormatError(f"{section}.columns: a column appears twice")
    for f in dataclasses.fields(cls):
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if no_default and f.name not in columns and f.name not in implied:
            raise SnapshotFormatError(f"{section}.columns: missing column {f.name!r}")
    # A column this reader does not know (from a newer exporter) is read as any value, under a name of ours (its
    # own need not be an identifier), and left out of the records.
    fields: list[tuple[Any, ...]] = [
        (c, hints[c]) if c in hints else (f"unknown_{i}", Any) for i, c in enumerate(columns)
    ]
    supplied = tuple(n for n in implied if n not in columns)
    # The supplied fields are set after decoding; no JSON value decodes as UNSET, so a row with extra values fails.
    fields += [(n, msgspec.UnsetType, msgspec.UNSET) for n in supplied]
    struct = msgspec.defstruct(f"{cls.__name__}Row", fields, array_like=True, gc=False)
    return _RowType(columns, msgspec.json.Decoder(list[struct]), supplied)  # type: ignore[valid-type]


_TABLE: Final[Any] = msgspec.defstruct("Table", [("columns", list[str]), ("rows", msgspec.Raw)], gc=False)
_LINK_TABLE_IMPLIED: Final = ("node", "uuid")
_HOST_JOB: Final = _object_struct(JobHostReading, node_implied=True)
_HOST: Final = _object_struct(
    HostReading,
    node_implied=True,
    extra=[("jobs", list[_HOST_JOB] | _TABLE | None, None)],  # type: ignore[valid-type]
)
_PROCESS: Final = _object_struct(
    ProcessReading, node_implied=False, extra=[(old, int | None, None) for old in _OLD_PROCESS_KEYS]
)
_NIC: Final = _object_struct(NicReading, node_implied=True)
_LINK_ROWS: Final = _row_type(LinkReading, LINK_COLUMNS, _LINK_TABLE_IMPLIED, "links")
_LINK_ROW: Final = _LINK_ROWS.decoder.type.__args__[0]
_HOST_FIELDS: Final = tuple(n for n in _names(HostReading) if n != "node")


def _section(item: Any) -> Any:
    return item | _TABLE | None


_DOCUMENT: Final[Any] = msgspec.defstruct(
    "SnapshotDocument",
    [
        ("schema", int),
        ("node", str),
        ("time", float),
        ("source", str, "unknown"),
        ("driver_version", str | None, None),
        ("layout", str, LAYOUT_ROWS),
        ("gpus", _section(list[GpuReading]), None),
        ("link_columns", list[str] | None, None),
        ("links", _section(list[_LINK_ROW]), None),  # type: ignore[valid-type]
        ("links_scope", str, LINKS_ALL),
        ("processes", _section(list[_PROCESS]), None),  # type: ignore[valid-type]
        ("jobs", _section(list[GpuJob]), None),
        ("job_info", _section(list[JobInfo]), None),
        ("migs", _section(list[MigReading]), None),
        ("nics", _section(list[_NIC]), None),  # type: ignore[valid-type]
        ("host", _HOST | None, None),
        ("nccl", NcclView | None, None),
        ("inspector", InspectorView | None, None),
        ("hardware", NodeHardware | None, None),
        ("errors", dict[str, int], msgspec.field(default_factory=dict)),
        ("stale", dict[str, float], msgspec.field(default_factory=dict)),
        ("nvml_hung_since", float | None, None),
    ],
    kw_only=True,
    gc=False,
)
_DECODER: Final = msgspec.json.Decoder(_DOCUMENT)
_SCHEMA_ONLY: Final[msgspec.json.Decoder[Any]] = msgspec.json.Decoder(
    msgspec.defstruct("SchemaOnly", [("schema", Any, None)])
)


# --- decoding: error messages ------------------------------------------------------------------------------------

_AT = re.compile(r"^(?P<what>.*?) - at (?P<key>`key` in )?`\$(?P<where>[^`]*)`$", re.DOTALL)
_ROW_CELL = re.compile(r"^\[(?P<row>\d+)\](?:\[(?P<col>\d+)\])?(?P<rest>.*)$", re.DOTALL)


def _format_error(exc: msgspec.ValidationError, section: str = "", columns: Sequence[str] = ()) -> SnapshotFormatError:
    """msgspec's "Expected `int`, got `str` - at `$.gpus[0].power_watts`" as "gpus[0].power_watts: expected ..."."""
    text = str(exc)
    match = _AT.match(text)
    what, where, key = (match["what"], match["where"], match["key"]) if match else (text, "", None)
    if not section and where.startswith(".links["):  # the row layout's link rows: name the column
        section, columns, where = "links", LINK_COLUMNS, where[len(".links") :]
    if section and columns:
        cell = _ROW_CELL.match(where)
        if cell is not None:
            row, col = cell["row"], cell["col"]
            if col is None and "length" in what:
                return SnapshotFormatError(f"{section}[{row}]: expected rows of {len(columns)} values")
            if col is not None and int(col) >= len(columns):
                return SnapshotFormatError(f"{section}[{row}]: expected rows of {len(columns)} values")
            name = f".{columns[int(col)]}" if col is not None else ""
            where = f"[{row}]{name}{cell['rest']}"
    path = (section + where).lstrip(".") or "snapshot"
    if key:
        path += " (a key)"
    return SnapshotFormatError(f"{path}: {what[:1].lower()}{what[1:]}")


def _convert(section: str, items: Any, cls: type) -> tuple[Any, ...]:
    if not items:  # most nodes send no MIG or inactive link rows: a conversion costs ~3 us even of nothing
        return ()
    try:
        return tuple(msgspec.convert(items, list[cls], from_attributes=True))  # type: ignore[valid-type]
    except msgspec.ValidationError as exc:
        raise _format_error(exc, section) from None


def _rows(section: str, table: Any, cls: type, implied: tuple[str, ...]) -> tuple[list[Any], tuple[str, ...]]:
    """The decoded rows of a columnar ``table``, and the fields still to be set on them (of ``implied``)."""
    row_type = _row_type(cls, tuple(table.columns), implied, section)
    try:
        return row_type.decoder.decode(table.rows), row_type.implied
    except msgspec.ValidationError as exc:
        raise _format_error(exc, section, row_type.columns) from None
    except msgspec.DecodeError as exc:  # pragma: no cover - the outer decode has already parsed the rows
        raise SnapshotFormatError(f"{section}.rows: {exc}") from None


def _supply(items: list[Any], names: Sequence[str], node: str) -> list[Any]:
    if "node" in names:
        for item in items:
            item.node = node
    return items


def _records(doc: Any, section: str, cls: type, node: str, *, columnar: bool) -> tuple[Any, ...]:
    """Section ``section`` as records ``cls``; the node is the document's where the section leaves it out."""
    value = getattr(doc, section)
    if value is None:
        return ()
    is_table = isinstance(value, _TABLE)
    if is_table != columnar:
        shape = "a table" if columnar else "an array"
        raise SnapshotFormatError(f"{section}: expected {shape} in the {doc.layout} layout")
    if is_table:
        rows, supplied = _rows(section, value, cls, ("node",))
        return _convert(section, _supply(rows, supplied, node), cls)
    if cls is ProcessReading:
        for p in value:
            for old, new in _OLD_PROCESS_KEYS.items():
                if getattr(p, new) is None and getattr(p, old) is not None:
                    setattr(p, new, getattr(p, old))
    elif cls is NicReading:
        _supply(value, ("node",), node)
    else:  # decoded as the records themselves
        return tuple(value)
    return _convert(section, value, cls)


def _links(doc: Any, node: str, gpus: Sequence[GpuReading], *, columnar: bool) -> tuple[LinkReading, ...]:
    value = doc.links
    if value is None or (not columnar and not value):
        return ()
    if isinstance(value, _TABLE):
        if not columnar:
            raise SnapshotFormatError(f"links: expected an array in the {doc.layout} layout")
        rows, supplied = _rows("links", value, LinkReading, _LINK_TABLE_IMPLIED)
    else:
        if columnar:
            raise SnapshotFormatError(f"links: expected a table in the {doc.layout} layout")
        if doc.link_columns != list(LINK_COLUMNS):
            raise SnapshotFormatError(f"link_columns: expected {list(LINK_COLUMNS)}")
        rows, supplied = value, _LINK_TABLE_IMPLIED
    if "uuid" in supplied:
        uuids = {g.gpu: g.uuid for g in gpus}
        for row in rows:
            uuid = uuids.get(row.gpu)
            if uuid is None:
                raise SnapshotFormatError(f"links: GPU {row.gpu} is not among the snapshot's GPUs")
            row.uuid = uuid
    return _convert("links", _supply(rows, supplied, node), LinkReading)


def _host(doc: Any, node: str, *, columnar: bool) -> tuple[HostReading | None, tuple[JobHostReading, ...]]:
    host = doc.host
    if host is None:
        return None, ()
    jobs: tuple[JobHostReading, ...] = ()
    if isinstance(host.jobs, _TABLE):
        rows, supplied = _rows("host.jobs", host.jobs, JobHostReading, ("node",))
        jobs = _convert("host.jobs", _supply(rows, supplied, node), JobHostReading)
    elif host.jobs:
        jobs = _convert("host.jobs", _supply(host.jobs, ("node",), node), JobHostReading)
    if all(getattr(host, name) is None for name in _HOST_FIELDS):
        return None, jobs
    host.node = node
    [reading] = _convert("host", [host], HostReading)
    return reading, jobs


def _snapshot(doc: Any) -> NodeSnapshot:
    if doc.schema not in SNAPSHOT_SCHEMAS_READ:
        raise SnapshotFormatError(f"snapshot: unsupported schema {doc.schema!r:.20}")
    if doc.layout not in LAYOUTS:
        raise SnapshotFormatError(f"layout: unknown layout {doc.layout!r:.20}; expected one of {', '.join(LAYOUTS)}")
    if doc.links_scope not in LINK_SCOPES:
        raise SnapshotFormatError(
            f"links_scope: unknown scope {doc.links_scope!r:.20}; expected one of {', '.join(LINK_SCOPES)}"
        )
    columnar = doc.layout == LAYOUT_COLUMNAR
    node = doc.node
    gpus: tuple[GpuReading, ...] = _records(doc, "gpus", GpuReading, node, columnar=columnar)
    host, job_hosts = _host(doc, node, columnar=columnar)
    return NodeSnapshot(
        node=node,
        timestamp=doc.time,
        source=doc.source,
        driver_version=doc.driver_version,
        gpus=gpus,
        links=_links(doc, node, gpus, columnar=columnar),
        links_scope=doc.links_scope,
        processes=_records(doc, "processes", ProcessReading, node, columnar=columnar),
        jobs=_records(doc, "jobs", GpuJob, node, columnar=columnar),
        job_info=_records(doc, "job_info", JobInfo, node, columnar=columnar),
        migs=_records(doc, "migs", MigReading, node, columnar=columnar),
        nics=_records(doc, "nics", NicReading, node, columnar=columnar),
        host=host,
        job_hosts=job_hosts,
        nccl=doc.nccl,
        inspector=doc.inspector,
        hardware=doc.hardware,
        errors=doc.errors,
        stale=doc.stale,
        nvml_hung_since=doc.nvml_hung_since,
    )


def snapshot_from_bytes(body: bytes | bytearray | memoryview) -> NodeSnapshot:
    """Parse and type-check a snapshot document's JSON text: schema 1 or 2, either layout.

    Raises ``SnapshotNotJSONError`` for text that is not JSON, ``SnapshotFormatError`` naming the field otherwise."""
    try:
        doc = _DECODER.decode(body)
    except msgspec.ValidationError as exc:
        try:
            schema = _SCHEMA_ONLY.decode(body).schema
        except msgspec.DecodeError:
            schema = None  # not an object: the full decode's message says so
        if schema is not None and schema not in SNAPSHOT_SCHEMAS_READ:
            raise SnapshotFormatError(f"snapshot: unsupported schema {schema!r:.20}") from None
        raise _format_error(exc) from None
    except msgspec.DecodeError as exc:
        raise SnapshotNotJSONError(str(exc)) from None
    return _snapshot(doc)


def _non_finite(doc: Any) -> str | None:
    """The path of the first NaN or infinity in a parsed document (JSON text cannot hold one; Python objects can)."""
    stack: list[tuple[str, Any]] = [("", doc)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                return path.lstrip(".") or "snapshot"
        elif isinstance(value, dict):
            stack.extend((f"{path}.{k}", v) for k, v in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
    return None


def snapshot_from_json(doc: Any) -> NodeSnapshot:
    """:func:`snapshot_from_bytes` for a document already parsed into Python objects (a spool, a test)."""
    if not isinstance(doc, dict):
        raise SnapshotFormatError("snapshot: expected a JSON object")
    bad = _non_finite(doc)
    if bad is not None:
        raise SnapshotFormatError(f"{bad}: expected a finite number")
    try:
        body = orjson.dumps(doc)
    except orjson.JSONEncodeError as exc:
        raise SnapshotFormatError(f"snapshot: {exc}") from None
    return snapshot_from_bytes(body)
