"""Who ran a job: user and job names leave the exporter only where the site asks for them (``--user-names``).

The job-to-GPU mapping stays whole without them: job ids, accounts and partitions are served as before, so alerts,
the jobs pages and the accounting per account or partition keep working. A user's name and a job's name (which often
carries a project or a person) are withdrawn from ``/metrics`` (their labels stay, empty) and from the snapshot
document, unless the exporter is started with ``--user-names`` (``GPULENS_EXPORTER_USER_NAMES``). Process command
names were already served only with ``--process-pids``, as pids are.
"""

from __future__ import annotations

import dataclasses

from gpulens.model import NodeSnapshot


def without_user_names(snapshot: NodeSnapshot) -> NodeSnapshot:
    """``snapshot`` with every user name and job name removed (None); the same object when it names none."""
    if not (
        any(j.user for j in snapshot.jobs)
        or any(p.user for p in snapshot.processes)
        or any(i.user or i.name for i in snapshot.job_info)
    ):
        return snapshot
    return snapshot.replace(
        jobs=tuple(dataclasses.replace(j, user=None) for j in snapshot.jobs),
        processes=tuple(dataclasses.replace(p, user=None) for p in snapshot.processes),
        job_info=tuple(dataclasses.replace(i, user=None, name=None) for i in snapshot.job_info),
    )
