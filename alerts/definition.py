"""What one builtin rule is, whole: its defaults, its check, what it reads, its round pre-filters, its PromQL.

A ``Definition`` is one entry of the catalogue (``alerts.catalogue``). Every place a rule runs reads it there:

- the engine (over SQL, over Prometheus, in ``gpulens simulate``) runs ``check``;
- a round over Prometheus (``alerts.promround``) reads ``round.fields`` of every GPU and tells the GPUs the rule could
  fire on with ``round.here`` (the round fields against the GPU's constants), ``round.promql`` (a PromQL filter)
  and ``round.counters`` (error counters compared across the rule's window, from the engine's own history);
- ``gpulens rules export --format prometheus`` writes ``export(rule)``, or names the rule gpulens-only with
  ``gpulens_only``, the reason PromQL cannot say it;
- the docs' table of rules and ``gpulens rules list`` print the catalogue.

Each of ``round`` and ``export`` takes the rule as configured (``AlertRule``, overrides applied), so a threshold
changed in the config changes every form at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpulens.alerts.base import AlertRule, Candidate
from gpulens.alerts.history import History
from gpulens.model import GpuReading

Check = Callable[[AlertRule, History, float], list[Candidate]]
# (rule, a GPU's round-field reading, its hardware constants or None) -> whether the rule could fire on it
RoundTest = Callable[[AlertRule, GpuReading, GpuReading | None], bool]


@dataclass(frozen=True)
class Exported:
    """One Prometheus alerting rule of a builtin: its expression, ``for``, extra labels and one-line summary (a
    template over the labels the expression keeps)."""

    expr: str
    for_s: float
    summary: str
    labels: Mapping[str, str] = field(default_factory=dict)


Export = Callable[[AlertRule], list[Exported]]


@dataclass(frozen=True)
class RoundPlan:
    """How a round over Prometheus reads for a rule without reading every GPU whole.

    ``fields``: what the rule reads of every GPU every round (the round fields). ``whole``: False where the check
    needs nothing beyond them (the job detectors, idle and lost GPUs, the fabric and node rules), so no GPU is read
    whole for it. Otherwise a GPU is read whole where any of the three tests names it: ``here`` (the round fields
    against the GPU's constants ``facts``), ``promql`` (a filter returning a series per GPU it names), ``counters``
    (the counters the rule compares across its ``window_s`` changed, as the engine's history tells; ``xids``: the
    XID counts). Each test names a superset of the GPUs the check fires on. ``ports``, ``hosts`` and ``nccl``: what
    else of the cluster the round reads for the rule, whole.
    """

    fields: tuple[str, ...] = ()
    whole: bool = True
    here: RoundTest | None = None
    facts: tuple[str, ...] = ()
    promql: Callable[[AlertRule], str] | None = None
    counters: Callable[[GpuReading], object] | None = None
    xids: bool = False
    reasons: tuple[str, ...] = ()  # the slowdown clock reasons ``here`` weighs (read of every GPU where set)
    ports: bool = False  # the RDMA ports' newest readings (the fabric rules, a stall's fabric evidence)
    hosts: bool = False  # the nodes' CPUs and memory and each job's share of them
    nccl: bool = False  # each node's NCCL RAS view
    hung: bool = False  # the nodes whose NVML is hung (``nvml_hung_since``)
    hardware: bool = False  # each node's hardware against what it should be, and its driver version
    inspector: bool = False  # each node's NCCL Inspector bandwidths


@dataclass(frozen=True)
class Definition:
    """One builtin rule: ``rule`` (name, severity, ``for``, thresholds, scope, meaning, action: the defaults the
    config overrides), ``check`` (the engine's), ``reads`` (the reading fields the check weighs, for the docs and
    the round's plan), ``round`` (its reads over Prometheus), and ``export`` (its PromQL) or ``gpulens_only``."""

    rule: AlertRule
    check: Check
    round: RoundPlan
    export: Export | None = None
    gpulens_only: str = ""
    reads: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if (self.export is None) == (not self.gpulens_only):
            raise ValueError(f"{self.rule.name}: give either its PromQL export or why it is gpulens-only")
