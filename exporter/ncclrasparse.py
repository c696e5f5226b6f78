"""Reading an NCCL RAS status report: the JSON document (NCCL 2.28.7 and later, ``ncclrasjson``) and the text report
of every generation since 2.24, into one ``RasReport`` (``ncclrasreport``, which also holds the bounds).

The text generations differ in what they name: 2.24 prints one "collective operation count" per rank and the missing
ranks as a list of numbers; 2.26 and later print the counts per collective ("AllReduce operation counts"), "not
launched any operations" for a count of 0, and each missing rank with its GPU, process and node. A rank that answered
without the communicator is listed under "Communicator ranks have different status" (``NOCOMM``; ``UNKNOWN`` and by
number only in 2.24) and read as missing, as the JSON document reads it. Text names a rank only where it stands out,
so a text report carries fewer ranks than a JSON one. Lines that match nothing are skipped; the text is read line by
line, so nothing of it is copied whole, except a run of other nodes' ranks past those the caller keeps, which is
skimmed whole (``_Skimmer``).

Hand-written rather than generated: NCCL publishes no grammar for the text report, only the printf formats in its
source (``src/ras/client_support.cc``), so these patterns follow those formats.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Final

from gpulens.exporter.ncclrasjson import parse_json
from gpulens.exporter.ncclrasreport import (
    ALL_COLLECTIVES,
    MAX_COUNT,
    MAX_KEPT_RANKS,
    LocalProcesses,
    RasComm,
    RasFormatError,
    RasRank,
    RasReport,
    ReportBuilder,
    Wanted,
    comm_hash,
)
from gpulens.ncclmodel import RANK_DEAD, RANK_MISSING, RANK_OK, RANK_UNRESPONSIVE

__all__ = [
    "ALL_COLLECTIVES",
    "RasComm",
    "RasFormatError",
    "RasRank",
    "RasReport",
    "comm_hash",
    "pair_numbered",
    "parse_json",
    "parse_report",
    "parse_text",
]

MISSING_STATUSES: Final = ("NOCOMM", "UNKNOWN")  # answered without the communicator (UNKNOWN: 2.24)


def parse_report(
    text: str, *, wanted: Wanted | None = None, max_kept: int = MAX_KEPT_RANKS, max_others: int = 0
) -> RasReport:
    """A report in either format, told apart by its first character. ``wanted`` picks the ranks to keep (the
    others only count in their communicator's aggregates); at most ``max_kept`` are kept, and beside them the first
    ``max_others`` ranks of other nodes."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return parse_json(stripped, wanted=wanted, max_kept=max_kept, max_others=max_others)
    return parse_text(text, wanted=wanted, max_kept=max_kept, max_others=max_others)


_HEADINGS = ("NCCL version ", "Job summary", "Communicators", "Group     Comms", "Errors", "Warnings")
_VERSION = re.compile(r"^NCCL version (\S{1,64})")
_GATHERED = re.compile(r"^Communicators\.\.\. \((\d{1,9}(?:\.\d{1,6})?)s\)")
_GROUP_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+(?:-\d+)?)\s+(\d+)\s+(\d+)\s+([A-Z]+)\s+([A-Z,]+)\s*$")
_COMM = re.compile(r"^#(\d{1,9})-(\d{1,9}) \(([0-9a-fA-F]{1,16})\) (INCOMPLETE|ERROR|MISMATCH)\s*$")
_WHO = r"(?: -- GPU (\d{1,9})(?: \(NVML (\d{1,9})\))? managed by process (-?\d{1,10}) on node (\S{1,64}))?"
_TAIL = r"(?: -- \[process information not found\])?$"
_DIFFERENT = re.compile(r"^  Communicator ranks have different (?:collective|(\w{1,32})) operation counts$")
_GROUP_COUNT = re.compile(r"^  (\d+) ranks have (?:launched up to operation (\d{1,20})|not launched any operations)$")
_GROUP_STATUS = re.compile(r"^  (\d+) ranks have status (\w{1,16})$")
_RANK_COUNT = re.compile(
    r"^  Rank (\d{1,9}) (?:has launched up to operation (\d{1,20})|has not launched any operations)" + _WHO + _TAIL
)
_RANK_STATUS = re.compile(r"^  Rank (\d{1,9}) has status (\w{1,16})" + _WHO + _TAIL)
_RANK_ERROR = re.compile(r"^  Rank (\d{1,9}) reported (.{1,80}?)" + _WHO + _TAIL)
_RANK_LISTED = re.compile(r"^  Rank (\d{1,9})" + _WHO + _TAIL)
_NUMBERED = re.compile(r"^  The (missing|unknown) ranks?: [\d,]")
_ASYNC = re.compile(r"^  Asynchronous errors? on (\d{1,9}) ranks?$")
_TIMEOUTS = re.compile(r"^  Encountered (\d{1,9}) communication timeouts?")
_PROCESS = re.compile(
    r"^  Process (-?\d{1,10}) on node (\S{1,64}) managing GPUs? (\d{1,9})(?:\S*)(?: \(NVML (\d{1,9}))?"
)
_SUMMARY_ROW = re.compile(r"^\s*(\d{1,9})\s+\d+(?:\s+\d+){0,3}\s*$")
_NUMBER = re.compile(r"\d{1,9}")


class _TextReader:
    """The state of one pass over the lines: the section and communicator block a line belongs to."""

    def __init__(self, builder: ReportBuilder) -> None:
        self.b = builder
        self.report = builder.report
        self.sizes: dict[int, int] = {}  # group -> ranks per communicator
        self.comm: RasComm | None = None
        self.section = ""  # DEAD, INCOMPLETE (job-wide), TIMEOUT, or a communicator block's word
        self.part = ""  # in a MISMATCH block: "status" or "counts"
        self.collective = ALL_COLLECTIVES
        self.group_count: int | None = None  # the count of the "N ranks have ..." line that "Rank R" lines follow
        self.group_status: str | None = None
        self.total_next = False  # the job summary's next row is its total

    def line(self, line: str) -> None:
        if not line.strip():
            self.comm, self.section, self.part, self.group_count, self.group_status = None, "", "", None, None
            return
        report = self.report
        if report.version is None and (m := _VERSION.match(line)):
            report.version = m.group(1)
        elif self.comm is None and not self.section and self._preamble(line):
            pass
        elif line in ("DEAD", "INCOMPLETE", "TIMEOUT"):
            self.comm, self.section, self.group_count = None, line, None
        elif m := _COMM.match(line):
            comm = self.b.comm(comm_hash(m.group(3)))
            assert comm is not None
            if comm.size is None:
                comm.size = self.sizes.get(int(m.group(1)))
            comm.status.add(m.group(4))
            self.comm, self.section, self.part = comm, m.group(4), ""
            self.collective, self.group_count, self.group_status = ALL_COLLECTIVES, None, None
        elif self.comm is None:
            self._job_wide(line)
        elif self.section == "MISMATCH":
            self._mismatch(self.comm, line)
        elif self.section == "INCOMPLETE":
            self._incomplete(self.comm, line)
        elif self.section == "ERROR":
            self._error(self.comm, line)

    def _preamble(self, line: str) -> bool:
        if line.startswith("(total)"):
            self.total_next = True
            return True
        if self.total_next and (m := _SUMMARY_ROW.match(line)):
            if self.report.nodes_total is None:
                self.report.nodes_total = int(m.group(1))
            self.total_next = False
            return True
        if m := _GROUP_ROW.match(line):
            self.sizes[int(m.group(1))] = int(m.group(5))
            return True
        if m := _GATHERED.match(line):
            self.report.collection_s = float(m.group(1))
            return True
        return False

    def _job_wide(self, line: str) -> None:
        if self.section in ("DEAD", "INCOMPLETE") and (m := _PROCESS.match(line)):
            gpu = min(int(m.group(4) or m.group(3)), 1024)
            self.b.lost(self.section == "DEAD", m.group(2), int(m.group(1)), gpu)
        elif self.section == "TIMEOUT" and (m := _TIMEOUTS.match(line)):
            self.report.timeouts = (self.report.timeouts or 0) + int(m.group(1))

    def _listed(self, comm: RasComm, m: re.Match[str], first: int) -> RasRank | None:
        """The rank a "Rank R ... -- GPU g (NVML n) managed by process P on node H" line names, with what it says."""
        gpu, nvml, pid, host = m.group(first), m.group(first + 1), m.group(first + 2), m.group(first + 3)
        entry = self.b.rank(comm, int(m.group(1)), host, int(pid) if pid is not None else None)
        if entry is not None and gpu is not None:
            entry.cuda_dev = min(int(gpu), 1024)
            entry.nvml_dev = min(int(nvml), 1024) if nvml is not None else entry.cuda_dev
        return entry

    def _count(self, comm: RasComm, rank: int, entry: RasRank | None, count: int) -> None:
        comm.note_count(self.collective, count)
        comm.note((rank, self.collective, count))
        if entry is not None:
            entry.counts[self.collective] = count

    def _status(self, comm: RasComm, rank: int, entry: RasRank | None, word: str) -> None:
        comm.note((rank, word))
        if entry is not None:
            entry.status = word
            if word in MISSING_STATUSES:
                entry.state = RANK_MISSING

    def _mismatch(self, comm: RasComm, line: str) -> None:
        if m := _DIFFERENT.match(line):
            self.part, self.group_count, self.group_status = "counts", None, None
            name = m.group(1) or ALL_COLLECTIVES
            self.collective = name
        elif line.startswith("  Communicator ranks have different"):
            self.part, self.group_count, self.group_status = "status", None, None
        elif self.part == "status":
            if m := _GROUP_STATUS.match(line):
                self.group_status = m.group(2)
                comm.note((int(m.group(1)), self.group_status))
            elif m := _RANK_STATUS.match(line):
                self._status(comm, int(m.group(1)), self._listed(comm, m, 3), m.group(2))
            elif (m := _NUMBERED.match(line)) and m.group(1) == "unknown":
                for n in _NUMBER.finditer(line, line.index(":")):
                    self._status(comm, int(n.group()), self.b.rank(comm, int(n.group())), "UNKNOWN")
            elif (m := _RANK_LISTED.match(line)) and self.group_status is not None:
                self._status(comm, int(m.group(1)), self._listed(comm, m, 2), self.group_status)
        elif self.part == "counts":
            if m := _GROUP_COUNT.match(line):
                self.group_count = min(int(m.group(2) or 0), MAX_COUNT)
                comm.majority.setdefault(self.collective, self.group_count)  # NCCL prints the most common first
                comm.note_count(self.collective, self.group_count)
                comm.note((int(m.group(1)), self.collective, self.group_count))
            elif m := _RANK_COUNT.match(line):
                count = min(int(m.group(2) or 0), MAX_COUNT)
                self._count(comm, int(m.group(1)), self._listed(comm, m, 3), count)
            elif (m := _RANK_LISTED.match(line)) and self.group_count is not None:
                self._count(comm, int(m.group(1)), self._listed(comm, m, 2), self.group_count)

    def _incomplete(self, comm: RasComm, line: str) -> None:
        if (m := _NUMBERED.match(line)) and m.group(1) == "missing":  # 2.24: numbers only
            for n in _NUMBER.finditer(line, line.index(":")):
                rank = int(n.group())
                comm.note((rank, RANK_MISSING))
                if (entry := self.b.rank(comm, rank)) is not None:
                    entry.state = RANK_MISSING
        elif m := _RANK_LISTED.match(line):  # 2.26+: the ranks whose process did not answer
            comm.note((int(m.group(1)), RANK_UNRESPONSIVE))
            if (entry := self._listed(comm, m, 2)) is not None:
                entry.state = RANK_UNRESPONSIVE

    def _error(self, comm: RasComm, line: str) -> None:
        if m := _ASYNC.match(line):
            comm.async_errors += int(m.group(1))
        elif (m := _RANK_ERROR.match(line)) and (entry := self._listed(comm, m, 3)) is not None:
            entry.error = m.group(2)


def parse_text(
    text: str, *, wanted: Wanted | None = None, max_kept: int = MAX_KEPT_RANKS, max_others: int = 0
) -> RasReport:
    head = text[:8192].splitlines()[:40]
    if not any(line.startswith(_HEADINGS) for line in head):
        raise RasFormatError("not a RAS status report (no NCCL version line or job summary)")
    builder = ReportBuilder("text", wanted, max_kept, max_others)
    reader = _TextReader(builder)
    skim = _Skimmer(reader, wanted) if isinstance(wanted, LocalProcesses) else None
    foreign = skim.foreign(text) if skim is not None else {}
    start, end = 0, len(text)
    while start < end:
        stop = text.find("\n", start)
        if stop < 0:
            stop = end
        if skim is not None and text.startswith("  Rank ", start) and skim.applies():
            start = skim.run(text, start)
            continue
        reader.line(text[start:stop].rstrip("\r"))  # each line its own copy, never the whole text again
        if start in foreign and reader.comm is not None:  # a block of none of the caller's ranks: counted, not read
            block_end, ranks = foreign[start]
            builder.count_read(reader.comm, ranks)
            stop = block_end
        start = stop + 1
    report = builder.finish()
    for c in report.comms:
        for r in c.ranks.values():
            if r.host is not None and r.pid is not None:
                if (r.host, r.pid) in report.dead:
                    r.state = RANK_DEAD
                elif (r.host, r.pid) in report.unresponsive and r.state == RANK_OK:
                    r.state = RANK_UNRESPONSIVE
    return report


_BLANK = re.compile(r"\n\r?\n")  # the end of a block
_RUN_END = re.compile(r"\n(?!  Rank )")  # the end of a run of "Rank R ..." lines
_OPERATIONS = re.compile(r"has launched up to operation (\d{1,20})")


class _Skimmer:
    """Past the ranks of other nodes the caller keeps (``ReportBuilder.others_full``), a run of "Rank R ..." lines
    holds nothing more to keep but this node's own lines, and its communicator's aggregates. A run of them (a hostile
    answer names 86,000 in 8 MiB) is then read whole at once: this node's lines found by searching for its hosts
    and pids and read as any line; of the others, the counts they reached (for the highest and lowest), how many
    ranks they name (for ``MAX_RANKS_READ``) and the run's text in the fingerprint. Their hosts are not noted."""

    def __init__(self, reader: _TextReader, local: LocalProcesses) -> None:
        self.reader = reader
        self.hosts = [f" on node {h}" for h in sorted(local.hosts)]
        alternatives = "|".join(str(p) for p in sorted(local.pids))
        self.pids = re.compile(rf"process (?:{alternatives}) on node ") if alternatives else None

    def foreign(self, text: str) -> dict[int, tuple[int, int]]:
        """The communicator blocks that hold none of the caller's ranks, by the offset of their first line: where the
        block's last line ends and how many ranks it names. Such a communicator is dropped whole at the end
        (``ReportBuilder.finish``), so nothing of it is read but its count of ranks. A block is the caller's when one
        of its lines names one of the caller's hosts or pids, names ranks by number (2.24), or names a rank with no
        node; a communicator of several blocks is foreign only if every one is."""
        blocks: list[tuple[int, int, int, str]] = []
        theirs: set[str] = set()
        at = 0 if text.startswith("#") else text.find("\n#")
        while at >= 0:
            head = at if text.startswith("#", at) else at + 1
            line_end = text.find("\n", head)
            m = _COMM.match(text[head : len(text) if line_end < 0 else line_end].rstrip("\r"))
            if m is None or line_end < 0:
                at = text.find("\n#", head)
                continue
            blank = _BLANK.search(text, line_end)
            block_end = blank.start() if blank is not None else len(text)
            key = comm_hash(m.group(3))
            mine = next(self._mine(text, line_end, block_end), None) is not None  # the cheapest test first
            ranks = 0 if mine else text.count("\n  Rank ", line_end, block_end)
            # ranks by number (2.24), or a rank with no node: kept whoever's they are
            mine = mine or text.find("\n  The ", line_end, block_end) >= 0
            if mine or text.count(" on node ", line_end, block_end) != ranks:
                theirs.add(key)
            else:
                blocks.append((head, block_end, ranks, key))
            at = text.find("\n#", block_end)
        return {head: (block_end, ranks) for head, block_end, ranks, key in blocks if key not in theirs}

    def _mine(self, text: str, start: int, end: int) -> Iterator[int]:
        """Where the caller's hosts and pids appear in ``text[start:end]``."""
        for needle in self.hosts:
            at = text.find(needle, start, end)
            while at >= 0:
                yield at
                at = text.find(needle, at + len(needle), end)
        if self.pids is not None:
            for m in self.pids.finditer(text, start, end):
                yield m.start()

    def applies(self) -> bool:
        r = self.reader
        return r.comm is not None and r.section in ("MISMATCH", "INCOMPLETE") and r.b.others_full

    def run(self, text: str, start: int) -> int:
        """Read the run of rank lines from ``start``; the offset past it."""
        r, comm = self.reader, self.reader.comm
        assert comm is not None
        m = _RUN_END.search(text, start)
        end = m.start() if m is not None else len(text)
        mine = {max(start, text.rfind("\n", start, at) + 1) for at in self._mine(text, start, end)}
        for line_start in sorted(mine):
            line_end = text.find("\n", line_start, end)
            r.line(text[line_start : end if line_end < 0 else line_end].rstrip("\r"))
        r.b.count_read(comm, text.count("\n", start, end) + 1 - len(mine))
        if r.section == "MISMATCH" and r.part == "counts":
            for count in set(_OPERATIONS.findall(text, start, end)):
                comm.note_count(r.collective, min(int(count), MAX_COUNT))
            if text.find("has not launched any operations", start, end) >= 0:
                comm.note_count(r.collective, 0)
        comm.note((r.section, r.part, r.collective, text[start:end]))
        return end + 1


def pair_numbered(report: RasReport) -> None:
    """NCCL 2.24 names a communicator's missing ranks by number and the processes RAS lost by host and pid, never
    the two together: where a communicator misses as many ranks as there are lost processes, they are paired in
    order (ranks ascending, processes by host and pid). An inference, so the reader makes it, not the parser."""
    lost = sorted(report.dead | report.unresponsive)
    if not lost:
        return
    for c in report.comms:
        numbered = sorted(
            r.rank for r in c.ranks.values() if r.state == RANK_MISSING and r.host is None and r.status is None
        )
        if not numbered or len(numbered) != len(lost):
            continue
        for rank, (host, pid) in zip(numbered, lost, strict=True):
            entry = c.ranks[rank]
            entry.host, entry.pid = host, pid
            entry.nvml_dev = entry.cuda_dev = report.gpu_of.get((host, pid))
            entry.state = RANK_DEAD if (host, pid) in report.dead else RANK_UNRESPONSIVE
            c.hosts.add(host)
