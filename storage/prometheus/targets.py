"""Which Prometheus scrape targets are gpulens's GPU exporters: the ``up`` that ``ExporterDown`` watches.

Prometheus keeps an ``up`` series for every target of every scrape job (node exporters, databases, Prometheus
itself); only the targets that serve GPU families belong to ``ExporterDown``. A job is watched when

* one of its targets serves a GPU family now: ``gpulens_exporter_build_info`` (one series per gpulens exporter) or a
  dcgm-exporter utilization family (``families.DCGM_PRESENCE``): one instant selection, however long the history;
* or its name matches ``EXPORTER_JOBS``, the job names of ``deploy/prometheus/`` and docs/prometheus.md. A job whose
  every target is down serves nothing, so the name keeps a whole fleet's outage alerting.

``watched_up`` gives that selection as PromQL, used both by ``PromReader.target_health`` (the targets that
``gpulens alerts run --db prometheus+http://...`` and the dashboard see) and by the exported ``ExporterDown`` rule
(``gpulens.alerts.promexport``): one definition for both. The collector's own job is watched by its self-health rules
(``gpulens.alerts.selfhealth``) through ``watched_up`` with its own family and job name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from gpulens.model import TargetHealth
from gpulens.storage.prometheus import families as fam
from gpulens.storage.prometheus.client import PromClient, quote

EXPORTER_JOBS: Final = "gpulens|dcgm|dcgm-exporter"  # anchored, as every Prometheus regex
EXPORTER_FAMILIES: Final = ("gpulens_exporter_build_info", *fam.DCGM_PRESENCE)
_SCRAPE_SERIES: Final = "up|scrape_duration_seconds|scrape_samples_scraped"


def watched_jobs(families: Sequence[str] = EXPORTER_FAMILIES, job_names: str = EXPORTER_JOBS) -> str:
    """PromQL: one series per watched job, labelled ``job`` only."""
    return (
        f"group by (job) ({fam.selector(families)}) "
        f"or group by (job) ({{__name__={quote('up')}, job=~{quote(job_names)}}})"
    )


def watched_up(
    selector: str = "up", families: Sequence[str] = EXPORTER_FAMILIES, job_names: str = EXPORTER_JOBS
) -> str:
    """PromQL: ``selector`` (``up``, or ``up == 0``) of the watched jobs' targets."""
    return f"{selector} and on(job) ({watched_jobs(families, job_names)})"


def exporter_down() -> str:
    """The ``ExporterDown`` expression: a watched target whose last scrape failed."""
    return watched_up("up == 0")


def target_health(client: PromClient, now: float) -> list[TargetHealth]:
    """The watched targets' health at ``now``: ``up``, scrape duration and samples, one instant query."""
    selected = "{__name__=~" + quote(_SCRAPE_SERIES) + "}"
    series = client.query(watched_up(selected), now)
    targets: dict[tuple[str, str], dict[str, Any]] = {}
    for s in series:
        key = (s.labels.get("job", ""), s.labels.get("instance", ""))
        targets.setdefault(key, {})[s.labels.get("__name__", "")] = s.value
        targets[key]["time"] = s.samples[-1][0]
    return [
        TargetHealth(
            target=f"{job}/{instance}" if job else instance,
            url=instance,
            kind="prometheus",
            timestamp=values["time"],
            up=values.get("up", 0.0) == 1.0,
            scrape_duration_seconds=values.get("scrape_duration_seconds"),
            samples=round(values.get("scrape_samples_scraped", 0.0)),
            last_error=None if values.get("up", 0.0) == 1.0 else "down in Prometheus (its /targets page says why)",
        )
        for (job, instance), values in sorted(targets.items())
    ]
