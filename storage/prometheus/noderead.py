"""The nodes whose GPU driver is hung, over Prometheus: the exporters' ``gpulens_node_nvml_hung`` (docs/self-health.md);
and each node's health, the exporters' ``gpulens_node_health{state}`` and ``gpulens_node_health_action{action}``.

One instant query that answers only the hung nodes (a healthy cluster answers nothing): of each node that says 1 now,
the first sample at 1 in the last hour, the store's best knowledge of since when (the exporter's own
``nvml_hung_since`` is in its snapshot, not in a series).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Protocol

from gpulens.clock import Clock
from gpulens.nodehealth import STATES, NodeHealth
from gpulens.storage.prometheus.client import PromClient, regex_of

HUNG: Final = "gpulens_node_nvml_hung == 1"


class PromReader(Protocol):
    """What this read uses of ``gpulens.storage.prometheus.reader.PromReader`` (which calls it)."""

    client: PromClient
    clock: Clock


def hung_nodes(reader: PromReader, *, max_age_s: float) -> dict[str, float]:
    """Each node hung now (its series newer than ``max_age_s``), with since when."""
    now = reader.clock.now()
    hung_now = f"max by (node) (({HUNG}) and timestamp(gpulens_node_nvml_hung) > {now - max_age_s:.3f})"
    first = f"min by (node) (min_over_time(timestamp({HUNG})[1h:]))"
    return {
        s.labels.get("node", ""): min(s.value, now)
        for s in reader.client.query(f"{first} and on(node) {hung_now}", now)
    }


def node_health(reader: PromReader, nodes: Sequence[str] | None = None) -> dict[str, NodeHealth]:
    """Each node's health now: the state its exporter says 1 for, and its action (no findings: Prometheus keeps the
    state, not the reasons). Two instant queries."""
    if nodes is not None and not nodes:
        return {}
    now = reader.clock.now()
    where = f", node=~{regex_of(nodes)}" if nodes else ""
    states = {
        s.labels.get("node", ""): s.labels.get("state", "")
        for s in reader.client.query(f"gpulens_node_health{{{where.lstrip(', ')}}} == 1", now)
    }
    actions = {
        s.labels.get("node", ""): s.labels.get("action", "none")
        for s in reader.client.query(f"gpulens_node_health_action{{{where.lstrip(', ')}}} == 1", now)
    }
    return {
        node: NodeHealth(state, (), actions.get(node, "none"))
        for node, state in states.items()
        if node and state in STATES
    }
