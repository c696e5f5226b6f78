"""``gpulens query``: the store read from a terminal (tables) or a script (``--json``, catalogue field names)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from gpulens.cli.base import UsageError
from gpulens.cli.table import render_table
from gpulens.ratios import share
from gpulens.storage.db import Database
from gpulens.storage.reading import StoreReader
from gpulens.storage.sqlreader import reader_of

_LATEST_COLUMNS = (
    "node",
    "gpu",
    "uuid",
    "model",
    "up",
    "utilization_ratio",
    "memory_used_bytes",
    "memory_total_bytes",
    "temperature_celsius",
    "power_watts",
    "job_id",
    "user",
    "timestamp",
)


def _latest(db: StoreReader) -> list[dict[str, Any]]:
    jobs = db.current_jobs()
    by_gpu: dict[str, list[tuple[str, str | None]]] = {}
    for job in jobs:
        by_gpu.setdefault(job.uuid, []).append((job.job_id, job.user))
    rows = []
    for reading in db.latest_readings():
        row = dataclasses.asdict(reading)
        row["xid_errors"] = {str(k): v for k, v in reading.xid_errors.items()}
        held = by_gpu.get(reading.uuid, [])
        row["job_id"] = ",".join(j for j, _ in held) or None
        row["user"] = ",".join(sorted({u for _, u in held if u})) or None
        rows.append(row)
    return rows


def _series(db: StoreReader, args: argparse.Namespace, now: float) -> list[dict[str, Any]]:
    try:
        data = db.series(args.gpu, args.field, now - args.since, now, max_points=max(2, args.points))
    except ValueError as exc:
        raise UsageError(f"query series: {exc}") from None
    rows = []
    for uuid, s in data.items():
        for i, t in enumerate(s.timestamps):
            row: dict[str, Any] = {"uuid": uuid, "time": t, "resolution": s.resolution}
            for field in args.field:
                row[field] = s.values[field][i]
            rows.append(row)
    return rows


def _jobs(db: StoreReader, args: argparse.Namespace, now: float) -> list[dict[str, Any]]:
    return [
        {
            "job_id": j.job_id,
            "user": j.user,
            "gpus": len(j.gpus),
            "nodes": len(j.nodes),
            "first_seen": j.first_seen,
            "last_seen": j.last_seen,
            "gpu_hours": round(j.gpu_hours, 3),
            "utilization_ratio_mean": j.utilization_ratio_mean,
            "utilization_ratio_stddev": j.utilization_ratio_stddev,
            "memory_used_bytes_mean": j.memory_used_bytes_mean,
            "memory_used_bytes_max": j.memory_used_bytes_max,
            "uuids": list(j.gpus),
            "node_names": list(j.nodes),
        }
        for j in db.jobs(now - args.since, now)
    ]


_NIC_COLUMNS = (
    "node",
    "device",
    "port",
    "link_layer",
    "state",
    "rate_bytes_per_second",
    "transmit_bytes_per_second",
    "transmit_rate_ratio",
    "receive_bytes_per_second",
    "receive_rate_ratio",
    "gpus",
    "symbol_errors_total",
    "link_downed_total",
    "receive_errors_total",
    "local_link_integrity_errors_total",
)


def _nics(db: StoreReader, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every port's latest reading; ``state`` is "ACTIVE/LinkUp" where known, else up/down; traffic as a share of
    the port's rate (``transmit_rate_ratio``, ``receive_rate_ratio``); ``gpus`` as "4,5"."""
    rows = []
    for n in db.latest_nics(node=args.node):
        row = dataclasses.asdict(n)
        states = [s for s in (n.state, n.phys_state) if s]
        row["state"] = "/".join(states) if states else ("up" if n.up else "down")
        row["gpus"] = ",".join(str(g) for g in n.gpus) or None
        row["saturated_counters"] = list(n.saturated_counters)
        row["transmit_rate_ratio"] = share(n.transmit_bytes_per_second, n.rate_bytes_per_second)
        row["receive_rate_ratio"] = share(n.receive_bytes_per_second, n.rate_bytes_per_second)
        rows.append(row)
    return rows


def _targets(db: StoreReader) -> list[dict[str, Any]]:
    return [dataclasses.asdict(t) for t in db.target_health()]


def run_query(store: Database | StoreReader, args: argparse.Namespace, now: float | None = None) -> str:
    """The text ``gpulens query`` prints for ``args``, read from ``store`` (SQL or any ``StoreReader``)."""
    import time

    db = reader_of(store)
    now = time.time() if now is None else now
    columns: tuple[str, ...] | None = None
    if args.what == "latest":
        rows = _latest(db)
        columns = _LATEST_COLUMNS
    elif args.what == "series":
        rows = _series(db, args, now)
    elif args.what == "jobs":
        rows = _jobs(db, args, now)
        columns = (
            "job_id",
            "user",
            "gpus",
            "nodes",
            "first_seen",
            "last_seen",
            "gpu_hours",
            "utilization_ratio_mean",
            "memory_used_bytes_max",
        )
    elif args.what == "nics":
        rows = _nics(db, args)
        columns = _NIC_COLUMNS
    else:
        rows = _targets(db)
        columns = ("target", "up", "node", "samples", "rejected", "scrape_duration_seconds", "timestamp", "last_error")
    if args.json:
        return json.dumps(rows, indent=None, separators=(",", ":")) + "\n"
    return render_table(rows, columns)
