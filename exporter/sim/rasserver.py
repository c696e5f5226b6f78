"""A simulated job's NCCL RAS: the real client protocol on a TCP port, answering in the JSON document (NCCL 2.28.7
and later, after ``SET FORMAT json``) or in the text report of the job's NCCL generation (2.24, or 2.26 and later).

The report is written from a ``RasState`` (communicators, their ranks with host, pid, GPU and collective counts, and
which processes RAS found unresponsive or dead), following the layout NCCL prints: the same headings, table columns
and sentences, and the same rule for which ranks a text report names one by one (outliers only). The agent's real
client code reads it, so the simulator exercises the exporter end to end. It counts the status queries it answers.

From NCCL 2.29 it answers ``MONITOR`` too: the connection stays open and a rank's process turning unresponsive, dead
or back is pushed as ``PEER_UNRESPONSIVE``, ``PEER_DEAD`` or ``PEER_RECOVERED``, in text or in JSON
(``MonitorFeed``; in process, without the TCP hop, for a replay in virtual time).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from gpulens.exporter.ncclmonitor import MonitorError, speaks_monitor, version_tuple
from gpulens.ncclmodel import RANK_DEAD, RANK_OK, RANK_UNRESPONSIVE

COLLECTIVES = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")


@dataclass
class SimRank:
    rank: int
    host: str
    pid: int
    gpu: int  # CUDA and NVML index alike
    counts: dict[str, int] = field(default_factory=dict)
    state: str = RANK_OK


@dataclass
class SimComm:
    hash: int
    ranks: list[SimRank]


@dataclass
class RasState:
    version: str  # "2.24.3", "2.26.2", "2.28.7", ...
    comms: list[SimComm] = field(default_factory=list)
    job: str = ""  # the simulated job it belongs to (not part of the report)


def speaks_json(version: str) -> bool:
    return version_tuple(version) >= (2, 28, 7)


def render_json(state: RasState) -> str:
    comms = []
    for c in state.comms:
        present = [r for r in c.ranks if r.state == RANK_OK]
        missing = [r for r in c.ranks if r.state != RANK_OK]
        comms.append(
            {
                "hash": f"0x{c.hash:x}",
                "secondary_hash": "0x1:0x2",
                "size": len(c.ranks),
                "ranks_count": len(present),
                "missing_ranks_count": len(missing),
                "ranks": [
                    {
                        "rank": r.rank,
                        "host": r.host,
                        "pid": r.pid,
                        "cuda_dev": r.gpu,
                        "nvml_dev": r.gpu,
                        "status": {
                            "init_state": 0,
                            "async_error": 0,
                            "finalize_called": False,
                            "destroy_flag": False,
                            "abort_flag": False,
                        },
                        "collective_counts": {name: r.counts.get(name, 0) for name in COLLECTIVES},
                    }
                    for r in present
                ],
                "missing_ranks": [
                    {
                        "rank": r.rank,
                        "host": r.host,
                        "pid": r.pid,
                        "cuda_dev": r.gpu,
                        "nvml_dev": r.gpu,
                        "status": {"unresponsive": True, "considered_dead": r.state == RANK_DEAD},
                    }
                    for r in missing
                ],
            }
        )
    doc = {
        "nccl_version": state.version,
        "cuda_runtime_version": 12080,
        "cuda_driver_version": 12080,
        "timestamp": "2026-01-01 00:00:00",
        "communicators_count": len(comms),
        "communicators": comms,
        "ras": {"collection_time_sec": 0.004, "timeouts_count": 0},
    }
    # orjson, not json: the standard library's encoder falls back to pure Python when it indents, and the detection
    # suites render thousands of these (a 256-rank communicator: 1.7 ms with the dict built, against 13 ms for
    # json.dumps alone; the same text)
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"


def _outlier(count: int, total: int, verbose: bool) -> bool:
    if count == 1:
        return True
    if verbose:
        return count < total * 0.5
    return count <= 10 and count <= total * 0.25


def _who(r: SimRank) -> str:
    return f"GPU {r.gpu} managed by process {r.pid} on node {r.host}"


def render_text(state: RasState, *, verbose: bool = True) -> str:
    new = version_tuple(state.version) >= (2, 26)
    hosts = {r.host for c in state.comms for r in c.ranks}
    procs = {(r.host, r.pid) for c in state.comms for r in c.ranks}
    out = [f"NCCL version {state.version} compiled with CUDA 12.8", "CUDA runtime version 12080, driver version 12080"]
    out += ["", "Job summary", "===========", ""]
    out += [
        "  Nodes  Processes         GPUs  Processes     GPUs",
        "(total)   per node  per process    (total)  (total)",
    ]
    per_node = len(procs) // max(1, len(hosts))
    out.append(f"{len(hosts):7d}  {per_node:9d}  {1:11d}  {len(procs):9d}  {len(procs):7d}")
    out += ["", "Communicators... (0.00s)", "=============", ""]
    out += ["Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors"]
    out += ["    #  in group  per comm  per node  per comm  in group"]
    blocks_err: list[str] = []
    blocks_warn: list[str] = []
    for i, c in enumerate(state.comms):
        missing = [r for r in c.ranks if r.state != RANK_OK]
        present = [r for r in c.ranks if r.state == RANK_OK]
        mismatched = _mismatched(present, new)
        errors = ",".join(x for x, on in (("INCOMPLETE", bool(missing)), ("MISMATCH", bool(mismatched))) if on)
        nodes = len({r.host for r in c.ranks})
        out.append(
            f"{i:5d}  {1:8d}  {nodes:8d}  {len(c.ranks) // max(1, nodes):8d}  {len(c.ranks):8d}  "
            f"{len(c.ranks):8d}  {'RUNNING':>8s}  {errors or 'OK':>6s}"
        )
        if missing:
            n = len(missing)
            blocks_err.append(f"#{i}-0 ({c.hash:016x}) INCOMPLETE")
            blocks_err.append(f"  Missing communicator data from {n} rank{'s' if n > 1 else ''}")
            if _outlier(n, len(c.ranks), verbose):
                if new:
                    blocks_err += [f"  Rank {r.rank} -- {_who(r)}" for r in missing]
                else:
                    listed = ",".join(str(r.rank) for r in missing)
                    blocks_err.append(f"  The missing rank{'s' if n > 1 else ''}: {listed}")
            blocks_err.append("")
        if mismatched:
            blocks_warn.append(f"#{i}-0 ({c.hash:016x}) MISMATCH")
            for name in mismatched:
                blocks_warn += _count_lines(present, name, len(c.ranks), verbose, new)
            blocks_warn.append("")
    out += ["", "Errors", "======", ""]
    dead = sorted({(r.host, r.pid, r.gpu) for c in state.comms for r in c.ranks if r.state == RANK_DEAD})
    unresponsive = sorted(
        {(r.host, r.pid, r.gpu) for c in state.comms for r in c.ranks if r.state == RANK_UNRESPONSIVE}
    )
    if unresponsive:
        n = len(unresponsive)
        out += ["INCOMPLETE", f"  Missing communicator data from {n} job process{'es' if n > 1 else ''}"]
        out += [f"  Process {pid} on node {host} managing GPU {gpu}" for host, pid, gpu in unresponsive]
        out.append("")
    if dead:
        n = len(dead)
        verb = "es are" if n > 1 else " is"
        out += ["DEAD", f"  {n} job process{verb} considered dead (unreachable via the RAS network)"]
        out += [f"  Process {pid} on node {host} managing GPU {gpu}" for host, pid, gpu in dead]
        out.append("")
    out += blocks_err
    out += ["Warnings", "========", ""]
    out += blocks_warn
    return "\n".join(out) + "\n"


_EVENT_OF = {RANK_UNRESPONSIVE: "PEER_UNRESPONSIVE", RANK_DEAD: "PEER_DEAD", RANK_OK: "PEER_RECOVERED"}
Peers = dict[tuple[str, int, int], str]


def peer_states(state: RasState | None) -> Peers:
    return {(r.host, r.pid, r.gpu): r.state for c in (state.comms if state else []) for r in c.ranks}


def render_event(event: str, peer: tuple[str, int, int], json: bool, stamp: str = "2026-01-01 00:00:00") -> str:
    host, pid, gpu = peer
    details = {"PEER_DEAD": "considered dead", "PEER_UNRESPONSIVE": "not responding", "PEER_RECOVERED": "recovered"}
    if json:
        doc = {
            "timestamp": stamp,
            "group": "lifecycle",
            "event": event,
            "peer": {"host": host, "pid": pid, "cuda_devs": [gpu], "nvml_devs": [gpu]},
            "details": details[event],
        }
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"
    return f"[{stamp}] {event}: {host} pid {pid} nvml_devs {gpu} {details[event]}\n"


class MonitorFeed:
    """A MONITOR stream over ``state()``: each ``recv`` pushes the changes of the ranks' states since the last
    (``b""`` once no job answers any more). Implements ``exporter.ncclmonitor.Link``."""

    def __init__(self, state: Callable[[], RasState | None], json: bool) -> None:
        first = state()
        if first is None or not speaks_monitor(first.version):
            raise MonitorError("nccl_monitor_refused", "this RAS does not speak MONITOR")
        self._state = state
        self._json = json
        self._peers = peer_states(first)

    def recv(self, timeout_s: float) -> bytes | None:
        state = self._state()
        if state is None:
            return b""
        now = peer_states(state)
        out = [
            render_event(_EVENT_OF[s], peer, self._json)
            for peer, s in sorted(now.items())
            if s != self._peers.get(peer, RANK_OK)
        ]
        self._peers = now
        if not out and timeout_s > 0:
            time.sleep(min(timeout_s, 0.1))
        return "".join(out).encode() if out else None

    def close(self) -> None:
        self._peers = {}


def _mismatched(present: list[SimRank], new: bool) -> list[str]:
    if not new:
        totals = {sum(r.counts.values()) for r in present}
        return ["all"] if len(totals) > 1 else []
    return [name for name in COLLECTIVES if len({r.counts.get(name, 0) for r in present}) > 1]


def _count_lines(present: list[SimRank], name: str, total: int, verbose: bool, new: bool) -> list[str]:
    def count(r: SimRank) -> int:
        return sum(r.counts.values()) if name == "all" else r.counts.get(name, 0)

    lines = [
        f"  Communicator ranks have different {name} operation counts"
        if new
        else "  Communicator ranks have different collective operation counts"
    ]
    tally = Counter(count(r) for r in present)
    for value, n in sorted(tally.items(), key=lambda kv: (-kv[1], -kv[0])):
        if n > 1:
            if value > 0 or not new:
                lines.append(f"  {n} ranks have launched up to operation {value}")
            else:
                lines.append(f"  {n} ranks have not launched any operations")
        if _outlier(n, total, verbose):
            for r in sorted((r for r in present if count(r) == value), key=lambda x: x.rank):
                if n > 1:
                    lines.append(f"  Rank {r.rank} -- {_who(r)}")
                elif value > 0 or not new:
                    lines.append(f"  Rank {r.rank} has launched up to operation {value} -- {_who(r)}")
                else:
                    lines.append(f"  Rank {r.rank} has not launched any operations -- {_who(r)}")
    return lines


class RasServer:
    """Serves ``state()`` over the RAS client protocol on ``host``:0 (a free port), one query per connection."""

    def __init__(
        self,
        state: Callable[[], RasState | None],
        host: str = "127.0.0.1",
        on_status: Callable[[RasState], None] | None = None,
        monitor_state: Callable[[], RasState | None] | None = None,
    ) -> None:
        self._state = state
        self._monitor_state = monitor_state or state  # read from the MONITOR streams' threads
        self._on_status = on_status
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(64)
        self.addr = f"{host}:{self._sock.getsockname()[1]}"
        self.status_queries = 0
        self._closed = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="sim-ras", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(conn,), daemon=True).start()

    def _client(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            fmt = "text"
            buffer = b""
            try:
                while True:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    buffer += chunk
                    while b"\n" in buffer:
                        raw, buffer = buffer.split(b"\n", 1)
                        cmd = raw.decode("ascii", "replace").strip()
                        reply, fmt, done = self._command(cmd, fmt)
                        conn.sendall(reply.encode())
                        if fmt.startswith("monitor-"):
                            self._push(conn, fmt == "monitor-json")
                        if done:
                            return
            except OSError:
                return

    def _push(self, conn: socket.socket, json: bool) -> None:
        """The MONITOR stream: events as the state changes, until no job answers or the client leaves."""
        try:
            feed = MonitorFeed(self._monitor_state, json)
        except MonitorError:
            return
        while not self._closed:
            data = feed.recv(0.1)
            if data == b"":
                return
            if data:
                conn.sendall(data)

    def _command(self, cmd: str, fmt: str) -> tuple[str, str, bool]:
        lower = cmd.lower()
        state = self._state()
        if lower.startswith("client protocol "):
            return "SERVER PROTOCOL 2\n", fmt, False
        if lower.startswith("timeout "):
            return ("OK\n" if cmd[8:].strip().isdigit() else f"ERROR: Invalid timeout value {cmd[8:]}\n"), fmt, False
        if lower.startswith("monitor") and state is not None and speaks_monitor(state.version):
            groups = lower[len("monitor") :].strip() or "lifecycle"
            bad = [g for g in groups.split(",") if g not in ("lifecycle", "trace", "all")]
            if bad:
                return f"ERROR: Invalid event group '{bad[0]}'\n", fmt, False
            return "OK\n", "monitor-" + fmt, True
        if lower.startswith("set format ") and state is not None and speaks_json(state.version):
            wanted = lower[len("set format ") :].strip()
            if wanted in ("json", "text"):
                return "OK\n", wanted, False
            return f"ERROR: Invalid format {cmd[11:]}\n", fmt, False
        if lower in ("status", "verbose status") and state is not None:
            with self._lock:
                self.status_queries += 1
            if self._on_status is not None:
                self._on_status(state)
            if fmt == "json":
                return render_json(state), fmt, True
            return render_text(state, verbose=lower.startswith("verbose")), fmt, True
        return f"ERROR: Unknown command {cmd}\n", fmt, False

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
