"""Fault to alert through NCCL RAS at job sizes of 2, 32 and 128 nodes (issue 40): the simulator's agents (the real
``NcclRasReader`` in turns) and the alert engine over SQL (``gpulens simulate``), in simulated seconds at a 10 s step.

Each size runs one training job over every node (2 GPUs a node, NCCL 2.28.7, JSON;
``tests/alerts/ncclscenarios.wide_job``) in which one rank on the last node stops before a collective
(``rank_missing``), and a second run in which that rank's process dies (``rank_dead``: RAS finds it unresponsive
after 5 s, dead after 60 s). The figure is the time from the fault to ``CommunicationStall`` firing with that
signature. With NCCL 2.29.2 the agents also read RAS's MONITOR stream (``rank_dead`` only: a stop before a
collective raises no event)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench import options
from gpulens.alerts.catalogue import COMMUNICATION_STALL
from gpulens.cli.simulation import simulate
from gpulens.config import parse_timestamp
from tests.alerts.ncclscenarios import FAULT_AT_S, JOB, START, wide_job

SIZES = (2, 32, 128)
MONITOR_VERSION = "2.29.2"


def measure(nodes: int, signature: str, version: str = "2.28.7") -> float | None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hang.toml"
        path.write_text(wide_job(nodes, signature, version=version))
        report = simulate(path)
    wanted = {"signature": signature, "job_id": JOB}
    starts = [
        parse_timestamp(str(alert["startsAt"]))
        for alert in report.alerts
        if alert["alertname"] == COMMUNICATION_STALL
        and isinstance(alert["labels"], dict)
        and all(alert["labels"].get(k) == v for k, v in wanted.items())
    ]
    return min(starts) - parse_timestamp(START) - FAULT_AT_S if starts else None


def main() -> None:
    options.no_arguments(__spec__.name if __spec__ else __name__, __doc__)
    for signature in ("rank_missing", "rank_dead"):
        for nodes in SIZES:
            took = measure(nodes, signature)
            value = f"{took:.0f} s" if took is not None else "never (within 4 min)"
            print(f"nccl_{signature}_to_alert_{nodes}_nodes: {value}")
    for nodes in SIZES:
        took = measure(nodes, "rank_dead", MONITOR_VERSION)
        value = f"{took:.0f} s" if took is not None else "never (within 4 min)"
        print(f"nccl_rank_dead_to_alert_monitor_{nodes}_nodes: {value}")


if __name__ == "__main__":
    main()
