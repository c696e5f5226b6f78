"""The nodes whose GPU driver is hung, over Prometheus: the exporters' ``gpulens_node_nvml_hung`` (docs/self-health.md).

One instant query that answers only the hung nodes (a healthy cluster answers nothing): of each node that says 1 now,
the first sample at 1 in the last hour, the store's best knowledge of since when (the exporter's own
``nvml_hung_since`` is in its snapshot, not in a series).
"""

from __future__ import annotations

from typing import Final, Protocol

from gpulens.clock import Clock
from gpulens.storage.prometheus.client import PromClient

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
