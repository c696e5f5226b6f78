"""NCCL RAS answers the agent must survive: the cost of the hostile answers of tests/exporter/rasanswers.py.

Printed: for a 2.24 text answer of "The missing ranks:" lines of 3,000 ranks each (1.1 million ranks), the ranks the
parser keeps and the peak of memory it allocates (``tracemalloc``) before it refuses the answer; for a text answer
naming 84,000 ranks on this node, the CPU of the collection that queries it (refused once it named twice the node's
room) and of each later collection (``time.process_time`` over 50 collections); for a JSON answer of 4,000
communicators (100 with a rank on this node), the CPU of reading it; for a text answer of 8 MiB naming 86,000 ranks
of other nodes (and the same with one rank of this node among them), the CPU of reading it line by line and skimmed
(``ncclrasparse._Skimmer``), in the same run. The answers are handed to the reader in process (no TCP hop).
"""

from __future__ import annotations

import contextlib
import sys
import time
import tracemalloc

from bench import options
from gpulens.clock import ManualClock
from gpulens.exporter.ncclras import NcclRasReader
from gpulens.exporter.ncclrasclient import RasAnswer
from gpulens.exporter.ncclrasparse import RasFormatError, parse_report
from gpulens.exporter.ncclrasreport import MAX_OTHER_RANKS
from tests.exporter import rasanswers

COLLECTIONS = 50


def main() -> None:
    options.no_arguments("bench.bench_ncclras", __doc__)
    text = rasanswers.missing_rank_lines(1_100_000)
    tracemalloc.start()
    kept = 0
    with contextlib.suppress(RasFormatError):
        kept = sum(len(c.ranks) for c in parse_report(text).comms)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"nccl_ras_missing_lines_ranks_kept: {kept} ranks")
    print(f"nccl_ras_missing_lines_peak: {peak / 2**20:.2f} MiB")

    local = rasanswers.local_ranks(84_000)
    reader = NcclRasReader(
        "bench:1", clock=ManualClock(1000.0), background=False, query=lambda: RasAnswer(local, "text", 0.0)
    )
    snap = rasanswers.node_snapshot()
    start = time.process_time()
    reader.enrich(snap)
    first = time.process_time() - start
    start = time.process_time()
    for _ in range(COLLECTIONS):
        reader.enrich(snap)
    later = (time.process_time() - start) / COLLECTIONS
    print(f"nccl_ras_84k_ranks_first_collection_cpu: {first * 1000:.0f} ms")
    print(f"nccl_ras_84k_ranks_later_collection_cpu: {later * 1000:.3f} ms")

    # 8 MiB naming 86,000 ranks of other nodes: read line by line (a caller the reader cannot search, as every
    # caller was before) and skimmed (the agent's LocalProcesses); then the same with one line of this node's
    local_procs = rasanswers.local_processes()
    for name, answer in (
        ("other_nodes", rasanswers.other_node_ranks(86_000)),
        ("other_nodes_one_mine", rasanswers.other_node_ranks(86_000, mine_at=60_000)),
    ):
        for way, wanted in (("line_by_line", lambda host, pid: local_procs(host, pid)), ("skimmed", local_procs)):
            start = time.process_time()
            for _ in range(5):
                parse_report(answer, wanted=wanted, max_kept=128, max_others=MAX_OTHER_RANKS)
            print(f"nccl_ras_8mib_{name}_{way}_cpu: {(time.process_time() - start) / 5 * 1000:.0f} ms")

    comms = rasanswers.new_comms(4000, 1)
    start = time.process_time()
    parse_report(comms, wanted=lambda host, pid: host == rasanswers.LOCAL_HOST, max_kept=128)
    print(f"nccl_ras_4000_comms_parse_cpu: {(time.process_time() - start) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
    sys.exit(0)
