"""The usage report's rows: the jobs' accounts added up per user, account or partition, one computation for both
backends (``storage.usagereport`` over SQL, ``storage.prometheus.usageread`` over Prometheus). Free of any SQL
library, so that the Prometheus reader loads none.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Final

from gpulens.storage.records import JobAccount, UsageRow

GROUPINGS: Final = ("user", "account", "partition")
UNKNOWN: Final = "(unknown)"
MAX_JOBS: Final = 5000  # jobs read per report: a bound on the work, said in the output when reached


def rows(accounts: Sequence[JobAccount], groups: Mapping[str, str | None], currency: str) -> list[UsageRow]:
    """The jobs' accounts added up per group (``groups``: job id -> its group; ``(unknown)`` where it has none),
    most GPU-hours first: the report's rows over either backend."""
    by_group: dict[str, list[JobAccount]] = defaultdict(list)
    for account in accounts:
        by_group[groups.get(account.job_id) or UNKNOWN].append(account)
    out = [_row(group, jobs, currency) for group, jobs in by_group.items()]
    return sorted(out, key=lambda r: (-r.gpu_hours, r.group))


def _row(group: str, jobs: list[JobAccount], currency: str) -> UsageRow:
    hours = sum(j.gpu_hours for j in jobs)
    judged = [j for j in jobs if j.idle_ratio is not None]
    judged_hours = sum(j.gpu_hours for j in judged)
    idle_hours = sum(j.gpu_hours * (j.idle_ratio or 0.0) for j in judged)
    energies = [j.energy_kwh for j in jobs if j.energy_kwh is not None]
    hung = [j for j in jobs if j.stall_seconds > 0]
    return UsageRow(
        group=group,
        jobs=len(jobs),
        gpu_hours=hours,
        used_gpu_hours=judged_hours - idle_hours if judged else None,
        idle_ratio=idle_hours / judged_hours if judged_hours > 0 else None,
        energy_kwh=sum(energies) if energies else None,
        cost=sum(j.cost for j in jobs),
        currency=currency,
        hung_jobs=len(hung),
        hung_seconds=sum(j.stall_seconds for j in hung),
    )
