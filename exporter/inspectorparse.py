"""The NCCL Inspector's two output formats, read into ``InspectorRecord`` (bytes/s and seconds, converted here once).

JSON (NCCL 2.28.3+, ``<host>-pid<pid>.log``): one compact JSON object per line, per completed collective and rank,
``{"header": {"id", "rank", "n_ranks", "nnodes"[, "comm_name"]}, "metadata": {..., "hostname", "pid"},
"coll_perf": {"coll", "coll_sn", "coll_msg_size_bytes", "coll_exec_time_us"[, "coll_timing_source"],
"coll_algobw_gbs", "coll_busbw_gbs"[, event traces]}}``; NCCL 2.30 adds point-to-point lines (``p2p_perf``), which
are skipped. Prometheus text (``nccl_inspector_metrics_<GPU UUID>.prom``, rewritten whole at each dump):
``nccl_bus_bandwidth_gbs`` and ``nccl_collective_exec_time_microseconds``; NCCL 2.29.3 labels each with ``comm_id``,
``rank``, ``slurm_job_id``, ``collective`` and ``message_size`` as ``16.00GB`` (the last collective), NCCL 2.30 with
``comm_name``, ``slurm_job_id``, ``collective`` and ``message_size`` as a range ``1-2GB`` (the mean over the dump
interval). docs/nccl-inspector.md cites NCCL's source for each.

Every input is untrusted: a line is bounded before it is decoded, a bad one raises ``InspectorLineError`` (one
line, counted by the caller), and a page is read by ``gpulens.promtext`` under its limits.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from gpulens.ncclinspect import BYTES_PER_GB, SECONDS_PER_US, InspectorRecord
from gpulens.promtext import LineStats, TextLimits, read_samples

MAX_LINE_BYTES: Final = 16_384  # a collective's line is ~400 bytes, ~2 KiB with the verbose event traces
PROM_LIMITS: Final = TextLimits(line_length=4_096, label_value_length=256, labels_per_series=32, series_per_page=4_096)
BUS_BW: Final = "nccl_bus_bandwidth_gbs"
EXEC_TIME: Final = "nccl_collective_exec_time_microseconds"
_SIZE_RE: Final = re.compile(r"^(?P<low>[0-9]+(?:\.[0-9]+)?)(?:-[0-9]+)?(?P<unit>B|KB|MB|GB|TB)$")
_UNIT_BYTES: Final = {"B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40}
_DECODER: Final = msgspec.json.Decoder(dict[str, Any])
_UNKNOWN: Final = ("", "unknown")


class InspectorLineError(ValueError):
    """One line that is not an Inspector record; the message is one line and names what is wrong."""


@dataclass(frozen=True, slots=True)
class PromPage:
    """What one Prometheus file held: its collectives' records, and its bad lines and limit hits."""

    records: list[InspectorRecord]
    bad_lines: int
    limit_hits: int


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InspectorLineError(f"{what} is not a number")
    out = float(value)
    if not math.isfinite(out) or out < 0:
        raise InspectorLineError(f"{what} is not a finite number at or above 0")
    return out


def _object(doc: dict[str, Any], key: str) -> dict[str, Any]:
    part = doc.get(key)
    if not isinstance(part, dict):
        raise InspectorLineError(f"no {key!r} object")
    return part


def parse_json_line(line: bytes) -> InspectorRecord | None:
    """One JSON line's record; None for a line that is not a collective's (blank, point-to-point)."""
    if len(line) > MAX_LINE_BYTES:
        raise InspectorLineError(f"line of {len(line)} bytes (at most {MAX_LINE_BYTES})")
    if not line.strip():
        return None
    try:
        doc = _DECODER.decode(line)
    except msgspec.DecodeError:
        raise InspectorLineError("not a JSON object") from None
    if "coll_perf" not in doc:
        if "p2p_perf" in doc:
            return None
        raise InspectorLineError("no 'coll_perf' object")
    header, meta, perf = _object(doc, "header"), _object(doc, "metadata"), _object(doc, "coll_perf")
    comm, coll = header.get("id"), perf.get("coll")
    if not isinstance(comm, str) or not comm or len(comm) > 64:
        raise InspectorLineError("header.id is not a communicator hash")
    if not isinstance(coll, str) or not coll or len(coll) > 64:
        raise InspectorLineError("coll_perf.coll is not a collective name")
    rank, pid = header.get("rank"), meta.get("pid")
    return InspectorRecord(
        comm=comm,
        collective=coll,
        size_bytes=int(_number(perf.get("coll_msg_size_bytes"), "coll_msg_size_bytes")),
        bus_bytes_per_second=_number(perf.get("coll_busbw_gbs"), "coll_busbw_gbs") * BYTES_PER_GB,
        seconds=_number(perf.get("coll_exec_time_us"), "coll_exec_time_us") * SECONDS_PER_US,
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else None,
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None,
    )


def message_size_bytes(label: str) -> int | None:
    """A Prometheus ``message_size`` label in bytes: ``16.00GB`` (2.29) or the lower bound of ``1-2GB`` (2.30),
    in NCCL's units of 1,024."""
    m = _SIZE_RE.match(label)
    if m is None:
        return None
    return int(float(m["low"]) * _UNIT_BYTES[m["unit"]])


def _known(value: str | None) -> str | None:
    return None if value is None or value in _UNKNOWN else value


def parse_prom_page(text: str, gpu: str | None = None) -> PromPage:
    """A Prometheus file's collectives: each pair of bandwidth and time with the same labels is one record.
    ``gpu``: the GPU UUID the file's name gives."""
    stats = LineStats()
    pairs: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
    bad = 0
    for sample in read_samples(text, stats, PROM_LIMITS):
        if sample.name not in (BUS_BW, EXEC_TIME):
            continue  # nccl_algorithm_bandwidth_gbs, the p2p families
        if not math.isfinite(sample.value) or sample.value < 0:
            bad += 1
            continue
        key = tuple(sorted(sample.labels.items()))
        pairs.setdefault(key, {})[sample.name] = sample.value
    records: list[InspectorRecord] = []
    for key, values in pairs.items():
        labels = dict(key)
        comm = _known(labels.get("comm_id")) or _known(labels.get("comm_name"))
        coll = labels.get("collective")
        size = message_size_bytes(labels.get("message_size", ""))
        if BUS_BW not in values or EXEC_TIME not in values or not comm or not coll or size is None:
            bad += 1
            continue
        rank = labels.get("rank", "")
        records.append(
            InspectorRecord(
                comm=comm,
                collective=coll,
                size_bytes=size,
                bus_bytes_per_second=values[BUS_BW] * BYTES_PER_GB,
                seconds=values[EXEC_TIME] * SECONDS_PER_US,
                rank=int(rank) if rank.isdigit() and len(rank) < 10 else None,
                job_id=_known(labels.get("slurm_job_id")),
                gpu=gpu,
            )
        )
    bad += sum(stats.bad_reasons.values())
    return PromPage(records, bad, sum(stats.limits.values()))
