"""Hostile RAS answers, as a local process answering on the RAS port could send them (issue: "tried as an attacker
would"), and the node they are aimed at. Shared by the hostile-answer tests and the RAS benchmark."""

from __future__ import annotations

import json

from gpulens.exporter.ncclrasreport import LocalProcesses
from gpulens.exporter.sim.rasserver import RasServer
from gpulens.model import GpuJob, GpuReading, NodeSnapshot, ProcessReading

LOCAL_HOST = "10.0.0.1"  # this node's address as RAS reports it
FIRST_PID = 5000
JOB = "job-7"

_HEAD_224 = """NCCL version 2.24.3 compiled with CUDA 12.6
CUDA runtime version 12060, driver version 12070

Job summary
===========

  Nodes  Processes         GPUs  Processes     GPUs
(total)   per node  per process    (total)  (total)
      2          8            1         16       16

Communicators... (0.01s)
=============

Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors
    #  in group  per comm  per node  per comm  in group
    0         1         2         8        16        15   RUNNING  INCOMPLETE

Errors
======

"""
_HEAD_226 = _HEAD_224.replace("2.24.3", "2.26.6").replace("INCOMPLETE\n\nErrors", "MISMATCH\n\nErrors")


def node_snapshot(node: str = "node-a", gpus: int = 8) -> NodeSnapshot:
    """A node of 8 GPUs, one process of ``JOB`` on each (pids FIRST_PID...)."""
    readings = tuple(GpuReading(node, i, f"GPU-{node}-{i}", "H100", 0.0) for i in range(gpus))
    procs = tuple(ProcessReading(node, i, f"GPU-{node}-{i}", FIRST_PID + i, job_id=JOB) for i in range(gpus))
    jobs = tuple(GpuJob(node, i, f"GPU-{node}-{i}", JOB) for i in range(gpus))
    return NodeSnapshot(node, 0.0, "test", gpus=readings, processes=procs, jobs=jobs)


def missing_rank_lines(total: int, per_line: int = 3000, per_comm: int = 99_000) -> str:
    """NCCL 2.24 text whose "The missing ranks:" lines hold ``per_line`` ranks each (numbers under 100,000, so a
    line stays under 20,000 characters), ``per_comm`` to a communicator, ``total`` in all."""
    lines = [_HEAD_224]
    for start in range(0, total, per_line):
        if start % per_comm == 0:
            lines.append(
                f"\n#0-0 ({start // per_comm + 1:016x}) INCOMPLETE\n  Missing communicator data from {per_comm} ranks\n"
            )
        ranks = range(start % per_comm, min(total - start, per_line) + start % per_comm)
        lines.append("  The missing ranks: " + ",".join(map(str, ranks)) + "\n")
    return "".join(lines)


def local_ranks(n: int) -> str:
    """NCCL 2.26 text naming ``n`` ranks of one communicator, all on this node, one AllReduce behind."""
    head = "#0-0 (00000000000000bb) MISMATCH\n  Communicator ranks have different AllReduce operation counts\n"
    head += "  1 ranks have launched up to operation 100\n"
    row = "  Rank {r} has launched up to operation 99 -- GPU {g} managed by process {p} on node " + LOCAL_HOST + "\n"
    return _HEAD_226 + head + "".join(row.format(r=r, g=r % 8, p=FIRST_PID + r % 8) for r in range(n))


def other_node_ranks(n: int, *, mine_at: int | None = None, top_at: int | None = None) -> str:
    """NCCL 2.26 text of one communicator naming ``n`` ranks of other nodes at operation 99 (8 MiB for 86,000);
    ``mine_at``: that rank is this node's instead; ``top_at``: that rank reached operation 250."""
    head = "#0-0 (00000000000000bb) MISMATCH\n  Communicator ranks have different AllReduce operation counts\n"
    head += "  1 ranks have launched up to operation 100\n"
    row = "  Rank {r} has launched up to operation {n} -- GPU {g} managed by process {p} on node {h}\n"
    rows = []
    for r in range(n):
        host, pid = f"10.9.{r // 2000}.{(r // 8) % 250}", 7000 + r % 8
        if r == mine_at:
            host, pid = LOCAL_HOST, FIRST_PID
        rows.append(row.format(r=r, n=250 if r == top_at else 99, g=r % 8, p=pid, h=host))
    return _HEAD_226 + head + "".join(rows) + "\nErrors\n======\n"


def local_processes() -> LocalProcesses:
    """What the agent of ``node_snapshot`` wants of an answer: its host's ranks and its processes'."""
    return LocalProcesses(frozenset({LOCAL_HOST}), frozenset(range(FIRST_PID, FIRST_PID + 8)))


def _rank(rank: int, host: str, pid: int, gpu: int, count: int) -> dict[str, object]:
    return {
        "rank": rank,
        "host": host,
        "pid": pid,
        "cuda_dev": gpu,
        "nvml_dev": gpu,
        "status": {"init_state": 0, "async_error": 0, "abort_flag": False},
        "collective_counts": {"AllReduce": count},
    }


def json_answer(comms: list[dict[str, object]]) -> str:
    doc = {"nccl_version": "2.30.7", "communicators_count": len(comms), "communicators": comms}
    doc["ras"] = {"collection_time_sec": 0.01, "timeouts_count": 0}
    return json.dumps(doc, separators=(",", ":"))


def job_comm(hash_: int, *, extra_hosts: int = 0, secondary: str = "0x1:0x2", count: int = 100) -> dict[str, object]:
    """A communicator of this node's 8 ranks and 8 on 10.0.0.2, plus one rank on each of ``extra_hosts`` hosts
    (9.x.y.1), which sort before this node's address: the attack pushes this node's place among the hosts back."""
    ranks = [_rank(r, LOCAL_HOST, FIRST_PID + r, r, count) for r in range(8)]
    ranks += [_rank(8 + r, "10.0.0.2", 6000 + r, r, count) for r in range(8)]
    ranks += [_rank(16 + i, f"9.{i // 250 % 250}.{i % 250}.1", 7000 + i, 0, count) for i in range(extra_hosts)]
    return {
        "hash": f"0x{hash_:x}",
        "secondary_hash": secondary,
        "size": len(ranks),
        "ranks_count": len(ranks),
        "missing_ranks_count": 0,
        "ranks": ranks,
        "missing_ranks": [],
    }


def new_comms(n: int, seed: int, local: int = 100) -> str:
    """``n`` communicators never seen before (hashes from ``seed``), each of two ranks; the first ``local`` have one
    rank on this node, the others run on two other nodes."""
    comms = []
    for i in range(n):
        here = _rank(0, LOCAL_HOST, FIRST_PID + i % 8, i % 8, 5) if i < local else _rank(0, "10.0.0.3", 6100, 0, 5)
        ranks = [here, _rank(1, "10.0.0.2", 6000, 0, 4)]
        comms.append({"hash": f"0x{seed * 100_000 + i + 1:x}", "secondary_hash": "0x1:0x2", "size": 2, "ranks": ranks})
    return json_answer(comms)


class AnswerServer(RasServer):
    """A RAS stand-in on a private port of 127.0.0.1 (the simulator's server and its client protocol) that answers
    each status query with the next of ``answers``, the last one again once they run out. ``close`` stops it."""

    def __init__(self, answers: list[str]) -> None:
        self.answers = answers
        super().__init__(lambda: None)

    def _command(self, cmd: str, fmt: str) -> tuple[str, str, bool]:
        lower = cmd.lower()
        text = self.answers[min(self.status_queries, len(self.answers) - 1)]
        if lower.startswith("client protocol "):
            return "SERVER PROTOCOL 2\n", fmt, False
        if lower.startswith("timeout "):
            return "OK\n", fmt, False
        if lower == "set format json":
            return ("OK\n" if text.startswith("{") else "ERROR: Unknown command SET FORMAT json\n"), fmt, False
        if lower.endswith("status"):
            self.status_queries += 1
            return text, fmt, True
        return f"ERROR: Unknown command {cmd}\n", fmt, False
