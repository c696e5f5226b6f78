"""What the SQL store keeps and a Prometheus-compatible store cannot serve: each such read of the store interface
(``storage.reading.StoreReader``) raises ``NotAvailableOnBackend`` naming the read, which the pages say in one
line (``gpulens.dashboard.components.not_available``) rather than showing nothing.

* **Job accounting**: the summary the collector computes and stores when a job ends (``storage.jobsummary``);
  nothing computes it over Prometheus.
* **NCCL communicator history**: the ranks NCCL RAS found behind or unreachable, with the collective and count of
  each, round by round, as the collector stores them (``storage.ncclstore``). Prometheus holds the exporters'
  ``gpulens_nccl_*`` series, but this reader does not rebuild the job page's stuck-rank history from them.
* **Drain actions** and **Remediation**: the slurm-drain decisions, the nodes remediation holds and its brake, which
  the alert engine writes to its own SQL store (``storage.slurmtables``, ``storage.remediationstore``), never to
  Prometheus.
"""

from __future__ import annotations

from typing import Any, Final

from gpulens.storage.reading import NotAvailableOnBackend
from gpulens.storage.records import JobAccount, StuckRank

BACKEND_NAME: Final = "Prometheus"  # how messages name the store (Thanos, Mimir and VictoriaMetrics answer the same)


class Unserved:
    """The reads a Prometheus-compatible store cannot serve, each raising ``NotAvailableOnBackend``."""

    def job_account(self, job_id: str) -> JobAccount | None:
        raise NotAvailableOnBackend("Job accounting", BACKEND_NAME)

    def stuck_ranks(self, job_id: str, start: float, end: float) -> list[StuckRank]:
        raise NotAvailableOnBackend("NCCL communicator history", BACKEND_NAME)

    def drain_actions(self, limit: int = 50) -> list[dict[str, Any]]:
        raise NotAvailableOnBackend("Drain actions", BACKEND_NAME, "they are kept in the alert engine's SQL store")

    def remediation_state(self) -> dict[str, Any]:
        raise NotAvailableOnBackend("Remediation", BACKEND_NAME, "it is kept in the alert engine's SQL store")
