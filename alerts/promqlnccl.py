"""PromQL of ``CommunicationStall``'s ``rank_missing`` signature (``alerts.ncclchecks``), exported beside the engine's.

A rank behind its communicator (``gpulens_nccl_rank_lag``) in a node's answer whose communicator has shown the same
mismatch for ``ras_mismatch_for`` counts, unless its own node saw it busy copying to the host within the last minute
(``gpulens_nccl_rank_busy``, a checkpoint writer); once the mismatch has held ``checkpoint_max_s`` the busy ones count
too. A job fires while any such rank is left; the value counts every rank behind in the held answers.

What PromQL does not say: the engine holds a busy spell for ``checkpoint_factor`` times the job's longest save, once
it has seen one (``alerts.ncclsaves``), and ``checkpoint_max_s`` only before. A save is a spell behind that ended
with the writer caught up; its length is the peak of ``gpulens_nccl_mismatch_age_seconds`` before a reset, and the
spell in progress is in the same series, so a range function cannot take the ended spells apart from it without
recording rules. Here a writer stuck in I/O fires at ``checkpoint_max_s`` (docs/prometheus-alerts.md).
"""

from __future__ import annotations


def rank_missing(hold_s: float, ceiling_s: float) -> str:
    """Per ``job_id``: the ranks behind a held mismatch, where one of them is not busy or the mismatch is past the
    ceiling."""
    behind = f"(gpulens_nccl_rank_lag > 0 and on(node, job_id, comm) (gpulens_nccl_mismatch_age_seconds >= {hold_s:g}))"
    idle = f"{behind} unless on(job_id, comm, rank) (max_over_time(gpulens_nccl_rank_busy[1m]) == 1)"
    past = f"{behind} and on(node, job_id, comm) (gpulens_nccl_mismatch_age_seconds >= {ceiling_s:g})"
    return f"count by (job_id) ({behind}) and on(job_id) (count by (job_id) ({idle}) or count by (job_id) ({past}))"
