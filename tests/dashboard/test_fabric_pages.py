"""The fabric on the pages' server side, over the test cluster's SQLite store (its ports, host and cgroups written
through storage's writer by ``tests.dashboard.fabricdata``): what each page shows, the honest gaps, and the bounded
reads each page makes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import pytest

from gpulens.dashboard import fabricview
from gpulens.dashboard.components import ViewState
from gpulens.dashboard.context import Context
from gpulens.dashboard.fabric import NO_PORTS
from gpulens.dashboard.figures.style import DOWN_COLOR
from gpulens.dashboard.formatting import MISSING
from gpulens.dashboard.pages import interconnect, job, overview
from gpulens.storage.reading import NotAvailableOnBackend, StoreReader
from gpulens.storage.sqlreader import SqlReader
from tests.dashboard.cluster import STALLED_JOB
from tests.dashboard.conftest import Store
from tests.dashboard.fabricdata import NO_FABRIC_NODE
from tests.dashboard.test_pages import find_figures, text_of

FABRIC_READS = frozenset(
    {
        *("latest_nics", "nic_counts", "nic_problems", "latest_hosts", "latest_job_hosts"),
        *("nic_series", "host_series", "job_host_series"),
    }
)


class Recorder:
    """A StoreReader over another that counts each read (and the ports each ``nic_series`` asked for); with
    ``refuse_fabric`` it answers every fabric read as a backend without the fabric does."""

    def __init__(self, inner: StoreReader, *, refuse_fabric: bool = False) -> None:
        self.inner = inner
        self.refuse_fabric = refuse_fabric
        self.calls: Counter[str] = Counter()
        self.nic_ids: list[list[str]] = []
        self.nic_nodes: list[list[str] | None] = []  # the nodes each ``latest_nics`` asked for

    @contextmanager
    def snapshot(self) -> Iterator[Recorder]:
        yield self  # each read through the recorder, as counted

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if name in FABRIC_READS and self.refuse_fabric:
                raise NotAvailableOnBackend("RDMA ports and host", "prometheus")
            if name == "nic_series":
                self.nic_ids.append(list(args[0]))
            if name == "latest_nics":
                nodes = kwargs.get("nodes")
                self.nic_nodes.append(None if nodes is None else list(nodes))
            return value(*args, **kwargs)

        return call


def recorded(store: Store, **kw: Any) -> tuple[Context, Recorder]:
    recorder = Recorder(SqlReader(store.db), **kw)
    context = Context(db=cast("StoreReader", recorder), clock=store.clock, alerts=store.filled.alerts)
    return context, recorder


def fabric_reads(recorder: Recorder) -> dict[str, int]:
    return {k: v for k, v in recorder.calls.items() if k in FABRIC_READS}


def table_rows(view: Any) -> list[str]:
    """The text of each body row of the first table in ``view``."""
    found: list[str] = []

    def walk(node: Any) -> None:
        props = node.to_plotly_json()["props"] if hasattr(node, "to_plotly_json") else None
        if props is None:
            if isinstance(node, list | tuple):
                for item in node:
                    walk(item)
            return
        if type(node).__name__ == "Tbody":
            found.extend(" ".join(text_of(row).split()) for row in props["children"])
            return
        walk(props.get("children"))

    walk(view)
    return found


def test_the_interconnect_lists_every_port_problems_first(store: Store) -> None:
    context, recorder = recorded(store)
    outputs = interconnect.render(context, ViewState(), "node-01")
    status, _load, _options, chosen, topology, _degraded, _errors, fabric, note, _ = outputs
    assert status is None
    assert chosen == "node-01"
    rows = table_rows(fabric)
    assert len(rows) == 33  # 4 H100 nodes x 8 + node-02's RoCE storage port; node-03 reads none
    assert rows[0].startswith("node-01 mlx5_3/1 IB 4X NDR down")
    assert rows[1].startswith("node-02 mlx5_2/1 IB 2X NDR up 200 Gb/s")
    assert "degraded: 2X of 4X" in rows[1]
    assert rows[2].startswith("node-00 mlx5_5/1")
    assert "errors" in rows[2].split()  # (the alert engine's fabric rules, where they fire, are flagged after)
    assert rows[3].startswith("node-02 mlx5_5/1")
    assert "93%" in rows[3]
    assert "saturated" in rows[3].split()
    assert all("stale: no recent reading" in row for row in rows[4:12])  # node-04's exporter is down
    assert {row.split()[0] for row in rows[4:12]} == {"node-04"}
    assert any(row.startswith("node-02 mlx5_8/1 RoCE") for row in rows)
    assert "7 of 8 RDMA ports up" in note
    nics = next(t for t in topology.to_plotly_json()["data"] if t.get("name") == "NICs")
    down = [i for i, text in enumerate(nics["text"]) if "mlx5_3" in text]
    assert [nics["marker"]["color"][i] for i in down] == [DOWN_COLOR]
    # Bounded: every port's problems told by the store, then one read of the ports of the nodes in the table (and
    # the chosen node's, for the topology); one series read, of the one port with errors.
    assert fabric_reads(recorder) == {"nic_problems": 1, "latest_nics": 1, "nic_series": 1}
    assert recorder.nic_nodes == [["node-00", "node-01", "node-02", "node-04"]]
    assert recorder.nic_ids == [["node-00/mlx5_5/1"]]


def test_the_interconnect_reads_whole_only_the_ports_of_the_rows_it_shows(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    context, recorder = recorded(store)
    everything = table_rows(interconnect.render(context, ViewState(), "node-03")[7])
    for module in (interconnect, fabricview):
        monkeypatch.setattr(module, "PORT_ROWS", 3)
    context, recorder = recorded(store)
    _status, *_rest, fabric, _note, _ = interconnect.render(context, ViewState(), "node-03")
    rows = table_rows(fabric)
    assert rows == everything[:3]  # down, degraded, errors: the same rows, in the same order
    assert "33 ports · 1 down · problems first · showing the first 3" in text_of(fabric)
    # the nodes of those three rows and the chosen one (no ports), not every node's ports
    assert recorder.nic_nodes == [["node-00", "node-01", "node-02", "node-03"]]
    assert recorder.nic_ids == [["node-00/mlx5_5/1"]]  # the error rates of the rows shown that counted errors


def test_the_stores_tell_every_ports_problems(store: Store) -> None:
    problems = SqlReader(store.db).nic_problems(store.clock.now() - 3600, store.clock.now())
    assert len(problems) == 33
    flagged = {nic: found for nic, found in problems.items() if found}
    assert flagged == {
        "node-01/mlx5_3/1": ("down",),
        "node-02/mlx5_2/1": ("degraded",),
        "node-00/mlx5_5/1": ("errors",),
        "node-02/mlx5_5/1": ("saturated",),
    }  # node-04's ports are stale on the page, which the store does not judge: their readings are fine


def test_a_node_without_ports_says_so(store: Store) -> None:
    context, _ = recorded(store)
    *_rest, note, _ = interconnect.render(context, ViewState(), NO_FABRIC_NODE)
    assert note == f"{NO_FABRIC_NODE}: {NO_PORTS}"


def test_the_job_page_shows_its_fabric_traffic_and_host_cpu(store: Store) -> None:
    context, recorder = recorded(store)
    *_rest, fabric, _updated = job.render(context, ViewState(), STALLED_JOB)
    figures = find_figures(fabric)
    traffic = figures["job-chart-fabric"]
    assert traffic["data"][0]["y"] == ["node-00 (8 NICs)", "node-01 (8 NICs)"]
    assert [a["text"] for a in traffic["layout"]["annotations"]] == ["stall"]
    busy = [v for v in traffic["data"][0]["z"][0] if v is not None]
    assert max(busy) > 0.5  # ~55 % of the ports' rate before the stall
    assert busy[-1] == 0  # and nothing after it
    cpu = figures["job-chart-host-cpu"]
    assert [t["name"] for t in cpu["data"]] == ["node-00", "node-01", "limit 64 cores"]
    text = text_of(fabric)
    assert "16 ports on 2 node(s), 6400 Gb/s" in text
    assert "down now: node-01 mlx5_3" in text
    # its two nodes' ports, node by node (not the cluster's), then one series read of its own 16
    assert fabric_reads(recorder) == {"latest_nics": 2, "nic_series": 1, "latest_job_hosts": 1, "job_host_series": 1}
    assert [len(ids) for ids in recorder.nic_ids] == [16]  # the ports next to its 16 GPUs, no other


def test_a_single_node_job_reads_only_its_nodes_ports(store: Store) -> None:
    context, recorder = recorded(store)
    *_rest, fabric, _updated = job.render(context, ViewState(), "vision-finetune")
    traffic = find_figures(fabric)["job-chart-fabric"]
    assert traffic["data"][0]["y"] == ["node-02 (4 NICs)"]
    assert recorder.nic_ids == [[f"node-02/mlx5_{i}/1" for i in range(4)]]


def test_the_overview_has_a_fabric_column(store: Store) -> None:
    context, recorder = recorded(store)
    _status, cards, *_rest, fabric, _targets, _updated = overview.render(
        context, ViewState(), "utilization", "name", "", 1
    )
    card_text = {c.children[0].children: c.children[1].children for c in cards}
    assert card_text["Fabric ports up"] == "24/25"  # node-04's 8 are stale, not counted as up
    rows = table_rows(fabric)
    assert rows == [
        "node-00 8/8 0% errors",
        "node-01 7/8 0% none down",
        "node-02 9/9 93% none degraded saturated",
        "node-03 no RDMA ports read",
        f"node-04 8/8 {MISSING} none stale: no recent reading",
    ]
    # every node's ports counted (the card), the ports of the nodes shown read whole, one series read (errors)
    assert fabric_reads(recorder) == {"nic_counts": 1, "latest_nics": 1, "nic_series": 1}


def test_a_backend_without_the_fabric_says_so_on_every_page(store: Store) -> None:
    context, _ = recorded(store, refuse_fabric=True)
    _status, cards, *_rest, fabric, _targets, _ = overview.render(context, ViewState(), "utilization", "name", "", 1)
    assert "fabric: not available on this backend" in text_of(fabric)
    assert f"Fabric ports up {MISSING} not available on this backend" in text_of(cards)
    *_rest, ports, note, _ = interconnect.render(context, ViewState(), "node-01")
    assert text_of(ports) == "fabric: not available on this backend"
    assert note == "RDMA ports: not available on this backend"
    *_rest, job_fabric, _ = job.render(context, ViewState(), STALLED_JOB)
    text = text_of(job_fabric)
    assert "fabric: not available on this backend" in text
    assert "host CPU: not available on this backend" in text
    assert "0%" not in text  # never drawn as zero
