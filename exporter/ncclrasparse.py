"""Reading an NCCL RAS status report: the JSON document (NCCL 2.28.7 and later) and the text report of every
generation since 2.24, into one ``RasReport``.

The report is untrusted input (any local process can answer on the RAS port): every value is checked for type and
range, lines that match nothing are skipped, and a document that is not a RAS report raises ``RasFormatError`` with
one line saying why. The text generations differ in what they name: 2.24 prints one "collective operation count"
per rank and the missing ranks as a list of numbers; 2.26 and later print the counts per collective ("AllReduce
operation counts"), "not launched any operations" for a count of 0, and each missing rank with its GPU, process and
node. Text names a rank only where it stands out, so a text report carries fewer ranks than a JSON one.

Hand-written rather than generated: NCCL publishes no grammar for the text report, only the printf formats in its
source, so these patterns follow those formats.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Final

from gpulens.ncclmodel import RANK_DEAD, RANK_MISSING, RANK_OK, RANK_UNRESPONSIVE

MAX_COMMS: Final = 4096
MAX_RANKS: Final = 1 << 20  # over all communicators
MAX_COUNT: Final = (1 << 63) - 1
ALL_COLLECTIVES: Final = "all"  # NCCL 2.24's text counts every collective together
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")


class RasFormatError(ValueError):
    """The answer is not a RAS status report."""


@dataclass
class RasRank:
    rank: int
    host: str | None = None
    pid: int | None = None
    cuda_dev: int | None = None
    nvml_dev: int | None = None
    counts: dict[str, int] = field(default_factory=dict)
    state: str = RANK_OK


@dataclass
class RasComm:
    comm: str  # 16 lower-case hex digits
    size: int | None = None
    status: set[str] = field(default_factory=set)
    ranks: dict[int, RasRank] = field(default_factory=dict)
    # Text only: collective -> the count most ranks reached (the ranks at that count are not named one by one).
    majority: dict[str, int] = field(default_factory=dict)

    def rank_entry(self, rank: int) -> RasRank:
        entry = self.ranks.get(rank)
        if entry is None:
            entry = self.ranks[rank] = RasRank(rank)
        return entry


@dataclass
class RasReport:
    format: str  # "json" or "text"
    version: str | None = None
    comms: list[RasComm] = field(default_factory=list)
    # Text only: processes RAS considers dead or could not reach, as (host, pid) - the ranks they ran take that state.
    dead: set[tuple[str, int]] = field(default_factory=set)
    unresponsive: set[tuple[str, int]] = field(default_factory=set)
    gpu_of: dict[tuple[str, int], int] = field(default_factory=dict)  # text: such a process's first GPU (NVML)
    nodes_total: int | None = None  # text: the job summary's node count


def comm_hash(raw: str) -> str:
    text = raw.strip().lower()
    if text.startswith("0x"):
        text = text[2:]
    if not text or len(text) > 16 or any(c not in "0123456789abcdef" for c in text):
        raise RasFormatError(f"communicator hash {raw[:40]!r} is not 64-bit hexadecimal")
    return text.rjust(16, "0")


def parse_report(text: str) -> RasReport:
    """A report in either format, told apart by its first character."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return parse_json(stripped)
    return parse_text(text)


# --- JSON --------------------------------------------------------------------------------------------------------


def _int(value: Any, what: str, low: int = -1, high: int = MAX_COUNT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RasFormatError(f"{what} is {str(value)[:40]!r}, not an integer in [{low}, {high}]")
    return value


def _str(value: Any, what: str, limit: int = 256) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise RasFormatError(f"{what} is not a string of at most {limit} characters")
    return value


def _obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RasFormatError(f"{what} is not an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise RasFormatError(f"{what} is not a list")
    return value


def parse_json(text: str) -> RasReport:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise RasFormatError(f"not JSON: {str(exc)[:80]}") from None
    doc = _obj(doc, "the document")
    version = doc.get("nccl_version")
    report = RasReport("json", _str(version, "nccl_version", 64) if version is not None else None)
    comms = _list(doc.get("communicators"), "communicators")
    if len(comms) > MAX_COMMS:
        raise RasFormatError(f"{len(comms)} communicators, more than {MAX_COMMS}")
    total = 0
    for i, raw in enumerate(comms):
        c = _obj(raw, f"communicators[{i}]")
        comm = RasComm(comm_hash(_str(c.get("hash"), f"communicators[{i}].hash", 20)))
        comm.size = _int(c.get("size"), f"communicators[{i}].size", 0, MAX_RANKS)
        ranks = _list(c.get("ranks", []), f"communicators[{i}].ranks")
        missing = _list(c.get("missing_ranks", []), f"communicators[{i}].missing_ranks")
        total += len(ranks) + len(missing)
        if total > MAX_RANKS:
            raise RasFormatError(f"more than {MAX_RANKS} ranks")
        for j, r in enumerate(ranks):
            entry = _json_rank(_obj(r, f"communicators[{i}].ranks[{j}]"), f"communicators[{i}].ranks[{j}]")
            raw_counts = _obj(r.get("collective_counts", {}), "collective_counts")
            for name, count in raw_counts.items():
                if not _NAME.match(name):
                    raise RasFormatError(f"collective name {name[:40]!r} is not a name")
                entry.counts[name] = _int(count, f"the {name} count", 0)
            status = r.get("status")
            if isinstance(status, dict) and status.get("abort_flag") is True:
                comm.status.add("ERROR")
            comm.ranks[entry.rank] = entry
        for j, r in enumerate(missing):
            where = f"communicators[{i}].missing_ranks[{j}]"
            entry = _json_rank(_obj(r, where), where)
            status = _obj(r.get("status", {}), f"{where}.status")
            if status.get("considered_dead") is True:
                entry.state = RANK_DEAD
            elif status.get("unresponsive") is True:
                entry.state = RANK_UNRESPONSIVE
            else:
                entry.state = RANK_MISSING
            comm.ranks[entry.rank] = entry
        if missing:
            comm.status.add("INCOMPLETE")
        if _counts_differ(comm):
            comm.status.add("MISMATCH")
        report.comms.append(comm)
    return report


def _json_rank(r: dict[str, Any], where: str) -> RasRank:
    host = r.get("host")
    pid = r.get("pid")
    return RasRank(
        rank=_int(r.get("rank"), f"{where}.rank", 0, MAX_RANKS),
        host=_str(host, f"{where}.host", 64) if host is not None else None,
        pid=_int(pid, f"{where}.pid", -1, 1 << 31) if pid is not None else None,
        cuda_dev=_int(r.get("cuda_dev", -1), f"{where}.cuda_dev", -1, 1024),
        nvml_dev=_int(r.get("nvml_dev", -1), f"{where}.nvml_dev", -1, 1024),
    )


def _counts_differ(comm: RasComm) -> bool:
    seen: dict[str, int] = {}
    for r in comm.ranks.values():
        if r.state != RANK_OK:
            continue
        for name, count in r.counts.items():
            if seen.setdefault(name, count) != count:
                return True
    return False


# --- text --------------------------------------------------------------------------------------------------------

_HEADINGS = ("NCCL version ", "Job summary", "Communicators", "Group     Comms", "Errors", "Warnings")
_VERSION = re.compile(r"^NCCL version (\S{1,64})")
_GROUP_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+(?:-\d+)?)\s+(\d+)\s+(\d+)\s+([A-Z]+)\s+([A-Z,]+)\s*$")
_COMM = re.compile(r"^#(\d+)-(\d+) \(([0-9a-fA-F]{1,16})\) (INCOMPLETE|ERROR|MISMATCH)\s*$")
_WHO = r"(?: -- GPU (\d+)(?: \(NVML (\d+)\))? managed by process (-?\d+) on node (\S{1,64}))?"
_DIFFERENT = re.compile(r"^  Communicator ranks have different (?:collective|(\w{1,32})) operation counts$")
_GROUP_COUNT = re.compile(r"^  (\d+) ranks have (?:launched up to operation (\d+)|not launched any operations)$")
_RANK_COUNT = re.compile(
    r"^  Rank (\d+) (?:has launched up to operation (\d+)|has not launched any operations)"
    + _WHO
    + r"(?: -- \[process information not found\])?$"
)
_RANK_LISTED = re.compile(r"^  Rank (\d+)" + _WHO + r"(?: -- \[process information not found\])?$")
_MISSING_LIST = re.compile(r"^  The missing ranks?: ([\d,]{1,20000})$")
_PROCESS = re.compile(r"^  Process (-?\d+) on node (\S{1,64}) managing GPUs? (\d+)(?:\S*)(?: \(NVML (\d+))?")
_SUMMARY_ROW = re.compile(r"^\s*(\d+)\s+\d+(?:\s+\d+){0,3}\s*$")


def parse_text(text: str) -> RasReport:
    lines = text.splitlines()
    if not any(line.startswith(_HEADINGS) for line in lines[:40]):
        raise RasFormatError("not a RAS status report (no NCCL version line or job summary)")
    report = RasReport("text")
    sizes: dict[int, int] = {}  # group -> ranks per communicator
    comms: dict[str, RasComm] = {}
    comm: RasComm | None = None
    section = ""  # the heading the lines below belong to: DEAD, INCOMPLETE (job-wide), or a communicator's block
    collective = ALL_COLLECTIVES
    group_count: int | None = None  # the count of the "N ranks have ..." line the "Rank R -- ..." lines follow
    ranks_seen = 0
    for line in lines:
        if not line.strip():
            comm, section, group_count = None, "", None
            continue
        if report.version is None and (m := _VERSION.match(line)):
            report.version = m.group(1)
            continue
        if report.nodes_total is None and (m := _SUMMARY_ROW.match(line)) and comm is None and not section:
            report.nodes_total = min(int(m.group(1)), MAX_RANKS)
            continue
        if (m := _GROUP_ROW.match(line)) and comm is None and not section:
            sizes[int(m.group(1))] = int(m.group(5))
            continue
        if line in ("DEAD", "INCOMPLETE", "TIMEOUT"):
            comm, section, group_count = None, line, None
            continue
        if m := _COMM.match(line):
            key = comm_hash(m.group(3))
            comm = comms.get(key)
            if comm is None:
                if len(comms) >= MAX_COMMS:
                    raise RasFormatError(f"more than {MAX_COMMS} communicators")
                comm = comms[key] = RasComm(key, size=sizes.get(int(m.group(1))))
            comm.status.add(m.group(4))
            section, collective, group_count = m.group(4), ALL_COLLECTIVES, None
            continue
        if comm is None:
            if section in ("DEAD", "INCOMPLETE") and (m := _PROCESS.match(line)):
                target = report.dead if section == "DEAD" else report.unresponsive
                process = (m.group(2), int(m.group(1)))
                target.add(process)
                report.gpu_of[process] = min(int(m.group(4) or m.group(3)), 1024)
            continue
        ranks_seen += 1
        if ranks_seen > MAX_RANKS:
            raise RasFormatError(f"more than {MAX_RANKS} rank lines")
        if section == "MISMATCH":
            if m := _DIFFERENT.match(line):
                collective = m.group(1) or ALL_COLLECTIVES
                if not _NAME.match(collective):
                    collective = ALL_COLLECTIVES
                group_count = None
            elif line.startswith("  Communicator ranks have different"):
                group_count = None  # a difference of status: its ranks carry no counts
                collective = ""
            elif not collective:
                continue
            elif m := _GROUP_COUNT.match(line):
                group_count = int(m.group(2) or 0)
                if group_count > MAX_COUNT:
                    raise RasFormatError("an operation count over 2^63")
                best = comm.majority.get(collective)
                if best is None:  # NCCL prints the most common count first
                    comm.majority[collective] = group_count
            elif m := _RANK_COUNT.match(line):
                entry = _listed(comm, m, 3)
                entry.counts[collective] = min(int(m.group(2) or 0), MAX_COUNT)
            elif (m := _RANK_LISTED.match(line)) and group_count is not None:
                entry = _listed(comm, m, 2)
                entry.counts[collective] = group_count
        elif section == "INCOMPLETE":
            if m := _MISSING_LIST.match(line):  # 2.24: numbers only
                for item in m.group(1).split(","):
                    if item:
                        comm.rank_entry(_bounded_rank(item)).state = RANK_MISSING
            elif m := _RANK_LISTED.match(line):  # 2.26+: the ranks whose process did not answer
                _listed(comm, m, 2).state = RANK_UNRESPONSIVE
    report.comms = list(comms.values())
    _place_numbered(report)
    for c in report.comms:
        for r in c.ranks.values():
            if r.host is not None and r.pid is not None:
                if (r.host, r.pid) in report.dead:
                    r.state = RANK_DEAD
                elif (r.host, r.pid) in report.unresponsive and r.state == RANK_OK:
                    r.state = RANK_UNRESPONSIVE
    return report


def _place_numbered(report: RasReport) -> None:
    """NCCL 2.24 names a communicator's missing ranks by number and the processes RAS lost by host and pid, never
    the two together: where a communicator misses as many ranks as there are lost processes, they are paired in
    order (ranks ascending, processes by host and pid)."""
    lost = sorted(report.dead | report.unresponsive)
    for c in report.comms:
        numbered = sorted(r.rank for r in c.ranks.values() if r.state == RANK_MISSING and r.host is None)
        if not numbered or len(numbered) != len(lost):
            continue
        for rank, (host, pid) in zip(numbered, lost, strict=True):
            entry = c.ranks[rank]
            entry.host, entry.pid = host, pid
            entry.nvml_dev = entry.cuda_dev = report.gpu_of.get((host, pid))
            entry.state = RANK_DEAD if (host, pid) in report.dead else RANK_UNRESPONSIVE


def _bounded_rank(text: str) -> int:
    value = int(text)
    if value > MAX_RANKS:
        raise RasFormatError(f"rank {value} is over {MAX_RANKS}")
    return value


def _listed(comm: RasComm, m: re.Match[str], first: int) -> RasRank:
    """The rank a "Rank R ... -- GPU g (NVML n) managed by process P on node H" line names, with what it says."""
    entry = comm.rank_entry(_bounded_rank(m.group(1)))
    gpu, nvml, pid, host = m.group(first), m.group(first + 1), m.group(first + 2), m.group(first + 3)
    if gpu is not None:
        entry.cuda_dev = min(int(gpu), 1024)
        entry.nvml_dev = min(int(nvml), 1024) if nvml is not None else entry.cuda_dev
        entry.pid = min(int(pid), 1 << 31)
        entry.host = host
    return entry
