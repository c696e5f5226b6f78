"""Reading NCCL RAS's JSON status document (NCCL 2.28.7 and later) within the bounds of ``ncclrasreport``.

The document is decoded as it is read: ``json.loads`` calls a hook for every object, innermost first, and the hook
folds each rank object into the communicator being read (counted against ``MAX_RANKS_READ`` at once, kept only when
the caller wants it) and returns nothing, so a document of many ranks never exists whole as Python objects. Before
decoding, the number of objects and lists is checked against what that many ranks can need (``MAX_CONTAINERS``).

NCCL 2.28.7-2.28.9 print no comma after ``"nvml_dev"`` in each missing rank's entry (``jsonWriteMissingRank``; fixed
in 2.29.2), so their document is not JSON exactly when ranks are missing. ``repair`` inserts that one comma, only
between a ``"nvml_dev": <integer>`` line and a ``"status"`` line, which is never valid JSON as it stands. JSON is
still preferred on those versions: their text report is the unsafe one (docs/nccl.md).
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

from gpulens.exporter.ncclrasreport import (
    MAX_COUNT,
    MAX_RANKS_READ,
    RasComm,
    RasFormatError,
    RasReport,
    ReportBuilder,
    Wanted,
    comm_hash,
)
from gpulens.ncclmodel import RANK_DEAD, RANK_MISSING, RANK_UNRESPONSIVE

MAX_CONTAINERS: Final = 4 * MAX_RANKS_READ + 64  # a rank is three objects (itself, status, counts) in a list
MAX_COLLECTIVES: Final = 16
# ncclResult_t, as NCCL numbers it (src/nccl.h.in); 8, ncclTimeout, from 2.30
NCCL_RESULTS: Final = (
    "ncclSuccess",
    "ncclUnhandledCudaError",
    "ncclSystemError",
    "ncclInternalError",
    "ncclInvalidArgument",
    "ncclInvalidUsage",
    "ncclRemoteError",
    "ncclInProgress",
    "ncclTimeout",
)
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
_SECONDARY = re.compile(r"^0x[0-9a-fA-F]{1,16}:0x[0-9a-fA-F]{1,16}$")
_MISSING_COMMA = re.compile(r'("nvml_dev": -?\d{1,10})(\r?\n[ \t]*"status":)')


def repair(text: str) -> str:
    """The 2.28.7-2.28.9 document with the comma NCCL leaves out after a missing rank's ``nvml_dev``."""
    return _MISSING_COMMA.sub(r"\1,\2", text)


def _int(value: Any, what: str, low: int = -1, high: int = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RasFormatError(f"{what} is {str(value)[:40]!r}, not an integer in [{low}, {high}]")
    return value


def _opt_int(value: Any, what: str, low: int, high: int) -> int | None:
    return None if value is None else _int(value, what, low, high)


def _str(value: Any, what: str, limit: int = 256) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise RasFormatError(f"{what} is not a string of at most {limit} characters")
    return value


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RasFormatError(f"{what} is not an object")
    return value


class _JsonReader:
    """The hook's state: the communicator whose ranks are being read (ranks come before their communicator's end)."""

    def __init__(self, builder: ReportBuilder) -> None:
        self.b = builder
        self.comm = RasComm("")  # a scratch communicator until its hash is read, at its end
        self.seen = 0  # communicators read
        self.errors = 0  # ranks of the current communicator with an error or an abort

    def hook(self, pairs: list[tuple[str, Any]]) -> Any:
        keys = {k for k, _ in pairs}
        if "rank" in keys:
            self._rank(dict(pairs))
            return None
        if "hash" in keys:
            self._comm(dict(pairs))
            return None
        return dict(pairs)

    def _rank(self, r: dict[str, Any]) -> None:
        where = f"communicators[{self.seen}] rank"
        comm = self.comm
        status = r.get("status")
        missing = isinstance(status, dict) and ("unresponsive" in status or "considered_dead" in status)
        host = r.get("host")
        host = _str(host, f"{where}.host", 64) if host is not None else None
        pid = _opt_int(r.get("pid"), f"{where}.pid", -1, 1 << 31)
        rank = _int(r.get("rank"), f"{where}.rank", 0)
        entry = self.b.rank(comm, rank, host, pid)
        if missing:
            assert isinstance(status, dict)
            state = RANK_DEAD if status.get("considered_dead") is True else RANK_MISSING
            if state != RANK_DEAD and status.get("unresponsive") is True:
                state = RANK_UNRESPONSIVE
            comm.note((rank, state))
            if entry is not None:
                entry.state = state
        else:
            counts = _obj(r.get("collective_counts", {}), f"{where}.collective_counts")
            if len(counts) > MAX_COLLECTIVES:
                raise RasFormatError(f"{where} names more than {MAX_COLLECTIVES} collectives")
            for name, count in counts.items():
                if not _NAME.match(name):
                    raise RasFormatError(f"collective name {name[:40]!r} is not a name")
                value = _int(count, f"the {name} count", 0)
                comm.note_count(name, value)
                comm.note((rank, name, value))
                if entry is not None:
                    entry.counts[name] = value
            error, init = None, None
            if isinstance(status, dict):
                code = _opt_int(status.get("async_error"), f"{where}.async_error", -1024, 1024)
                init = _opt_int(status.get("init_state"), f"{where}.init_state", -1024, 1024)
                if code:
                    error = NCCL_RESULTS[code] if 0 <= code < len(NCCL_RESULTS) else f"nccl error {code}"
                if code or status.get("abort_flag") is True:
                    self.errors += 1
            if entry is not None:
                entry.error, entry.init_state = error, init
        if entry is not None:
            entry.cuda_dev = _opt_int(r.get("cuda_dev"), f"{where}.cuda_dev", -1, 1024)
            entry.nvml_dev = _opt_int(r.get("nvml_dev"), f"{where}.nvml_dev", -1, 1024)

    def _comm(self, c: dict[str, Any]) -> None:
        where = f"communicators[{self.seen}]"
        self.seen += 1
        scratch, errors = self.comm, self.errors
        self.comm, self.errors = RasComm(""), 0
        hash_ = comm_hash(_str(c.get("hash"), f"{where}.hash", 20))
        raw = c.get("secondary_hash")
        secondary = None
        if raw is not None:
            if not isinstance(raw, str) or not _SECONDARY.match(raw):
                raise RasFormatError(f"{where}.secondary_hash is not two 64-bit hexadecimal numbers")
            secondary = raw.lower()
        if self.b.known(hash_, secondary):
            self.b.report.comms_duplicate += 1
            self.b.drop_comm(scratch)
            return
        comm = self.b.comm(hash_, secondary, _int(c.get("size"), f"{where}.size", 0, 1 << 20))
        assert comm is not None
        for name in ("ranks", "missing_ranks"):
            if name in c and not isinstance(c[name], list):
                raise RasFormatError(f"{where}.{name} is not a list")
        comm.ranks, comm.top, comm.low = scratch.ranks, scratch.top, scratch.low
        comm.fingerprint, comm.hosts, comm.ranks_read, comm.wanted = (
            scratch.fingerprint,
            scratch.hosts,
            scratch.ranks_read,
            scratch.wanted,
        )
        if any(r.state != "ok" for r in comm.ranks.values()) or c.get("missing_ranks"):
            comm.status.add("INCOMPLETE")
        if errors:
            comm.status.add("ERROR")
        if comm.differing():
            comm.status.add("MISMATCH")


def parse_json(text: str, *, wanted: Wanted | None = None, max_kept: int = 4096, max_others: int = 0) -> RasReport:
    containers = text.count("{") + text.count("[")
    if containers > MAX_CONTAINERS:
        raise RasFormatError(f"{containers} JSON objects and lists, more than {MAX_CONTAINERS}")
    builder = ReportBuilder("json", wanted, max_kept, max_others)
    reader = _JsonReader(builder)
    try:
        doc = json.loads(repair(text), object_pairs_hook=reader.hook)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, RasFormatError):
            raise
        raise RasFormatError(f"not JSON: {str(exc)[:80]}") from None
    doc = _obj(doc, "the document")
    if not isinstance(doc.get("communicators"), list):
        raise RasFormatError("communicators is not a list")
    if reader.comm.ranks_read:
        raise RasFormatError("ranks outside any communicator")
    report = builder.finish()
    version = doc.get("nccl_version")
    report.version = _str(version, "nccl_version", 64) if version is not None else None
    ras = doc.get("ras")
    if isinstance(ras, dict):
        report.timeouts = _opt_int(ras.get("timeouts_count"), "ras.timeouts_count", 0, 1 << 31)
        seconds = ras.get("collection_time_sec")
        if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 <= seconds < 1e6:
            report.collection_s = float(seconds)
    return report
