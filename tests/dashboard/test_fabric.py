"""The fabric's page logic on records: port problems and their order, a node's fabric in a line, a job's ports and
traffic, the honest words for a gap, the topology's ports, and the one bounded query an error-rate panel makes."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

from gpulens.alerts.state import AlertState
from gpulens.dashboard.components import ViewState
from gpulens.dashboard.fabric import (
    NO_PORTS,
    Unavailable,
    available,
    error_rates,
    firing_on_ports,
    gbit_text,
    gpus_text,
    job_nics,
    node_fabric,
    node_traffic,
    port_statuses,
    stale_nodes,
)
from gpulens.dashboard.fabricview import count_rate_text, fabric_card, load_bar, node_fabric_table, ports_table
from gpulens.dashboard.figures.fabric import nic_positions
from gpulens.dashboard.figures.links import node_topology
from gpulens.dashboard.figures.style import DOWN_COLOR
from gpulens.fabricmodel import NicReading
from gpulens.storage.reading import NotAvailableOnBackend
from gpulens.storage.records import SeriesData
from tests.dashboard.test_figures import T0, as_data, reading
from tests.dashboard.test_pages import text_of

NDR = 50e9


def nic(node: str = "node-00", device: str = "mlx5_0", **values: Any) -> NicReading:
    defaults: dict[str, Any] = {
        "port": 1,
        "link_layer": "InfiniBand",
        "state": "ACTIVE",
        "phys_state": "LinkUp",
        "up": True,
        "rate_bytes_per_second": NDR,
        "link_width": 4,
        "link_speed": "NDR",
        "transmit_bytes_per_second": 0.1 * NDR,
        "receive_bytes_per_second": 0.05 * NDR,
        "transmit_wait_per_second": 12.0,
        "symbol_errors_total": 0,
        "link_downed_total": 0,
        "receive_errors_total": 0,
        "local_link_integrity_errors_total": 0,
        "gpus": (int(device.rsplit("_", 1)[1]),),
    }
    defaults.update(values)
    return NicReading(node=node, device=device, **defaults)


def cluster() -> list[NicReading]:
    return [
        nic("node-00", "mlx5_0"),
        nic("node-00", "mlx5_1", symbol_errors_total=30),
        nic("node-00", "mlx5_2", transmit_bytes_per_second=0.95 * NDR),
        nic("node-01", "mlx5_0"),
        nic("node-01", "mlx5_1", up=False, state="DOWN", phys_state="Polling", transmit_bytes_per_second=0.0),
        nic("node-01", "mlx5_2", rate_bytes_per_second=NDR / 2, link_width=2),
    ]


def test_problems_come_first_down_degraded_errors_saturated() -> None:
    statuses = port_statuses(cluster(), {"node-00/mlx5_1/1": 0.5})
    order = [(s.nic.node, s.nic.device, s.problems) for s in statuses]
    assert order == [
        ("node-01", "mlx5_1", ("down",)),
        ("node-01", "mlx5_2", ("degraded",)),
        ("node-00", "mlx5_1", ("errors",)),
        ("node-00", "mlx5_2", ("saturated",)),
        ("node-00", "mlx5_0", ()),
        ("node-01", "mlx5_0", ()),
    ]
    degraded = statuses[1]
    assert degraded.degraded_detail == "2X of 4X"
    down = statuses[0]
    assert (down.tx_ratio, down.load) == (None, None)  # a down port has no load, not a zero one
    assert statuses[3].tx_ratio == 0.95


def test_error_rates_are_zero_only_where_the_counters_are_known() -> None:
    statuses = {s.nic.device: s for s in port_statuses([nic(device="mlx5_0"), nic(device="mlx5_1", **unknown())])}
    assert statuses["mlx5_0"].error_rate == 0.0
    assert statuses["mlx5_1"].error_rate is None


def unknown() -> dict[str, Any]:
    return dict.fromkeys(
        ("symbol_errors_total", "link_downed_total", "receive_errors_total", "local_link_integrity_errors_total")
    )


def test_texts() -> None:
    assert gpus_text((0, 1, 2, 3, 6)) == "0-3,6"
    assert gpus_text((5,)) == "5"
    assert gpus_text(()) == ""
    assert gbit_text(NDR) == "400 Gb/s"
    assert gbit_text(None) == "\u2013"
    assert count_rate_text(0.0) == "0"
    assert count_rate_text(3400.0) == "3.4k"
    assert count_rate_text(None) == "\u2013"


def test_a_load_bar_is_as_long_as_its_share() -> None:
    bar = load_bar(0.95, "47.5 GB/s")
    assert "warn" in bar.className  # type: ignore[union-attr]  # saturated: amber; red is for a port down
    assert "95%" in text_of(bar)
    assert "idle" in load_bar(0.0).className  # type: ignore[union-attr]
    assert "ok" in load_bar(0.4).className  # type: ignore[union-attr]
    assert load_bar(None) == "\u2013"


class CountingStore:
    """Just enough of a StoreReader for ``error_rates``: answers ``nic_series`` and counts the calls."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.asked: list[list[str]] = []

    def nic_series(
        self, nic_ids: Sequence[str], fields: Sequence[str], start: float, end: float, max_points: int = 1000
    ) -> dict[str, SeriesData]:
        self.calls["nic_series"] += 1
        self.asked.append(list(nic_ids))
        values = {f: (0.5, 1.5) if f == "symbol_errors_total" else (0.0, None) for f in fields}
        return {i: SeriesData(i, "raw", 10.0, (0.0, 10.0), values, values, values) for i in nic_ids}


def test_error_rates_read_only_the_ports_that_counted_errors_in_one_query() -> None:
    store = CountingStore()
    rates = error_rates(store, cluster(), 0.0, 3600.0)  # type: ignore[arg-type]
    assert store.calls == Counter({"nic_series": 1})
    assert store.asked == [["node-00/mlx5_1/1"]]
    assert rates == {"node-00/mlx5_1/1": 1.0}  # the mean over the buckets of the summed rates
    quiet = CountingStore()
    assert error_rates(quiet, [nic()], 0.0, 3600.0) == {}  # type: ignore[arg-type]
    assert quiet.calls == Counter()


def test_a_backend_without_the_fabric_is_unavailable_not_empty() -> None:
    def refuse() -> list[NicReading]:
        raise NotAvailableOnBackend("RDMA ports", "prometheus")

    got = available(refuse)
    assert isinstance(got, Unavailable)
    assert "not available on this backend" in text_of(ports_table(got, ViewState()))
    assert "not available on this backend" in text_of(node_fabric_table(["node-00"], got, ViewState()))
    assert "not available on this backend" in text_of(fabric_card(got))
    assert NO_PORTS in text_of(ports_table([], ViewState()))
    assert NO_PORTS in text_of(node_fabric_table(["node-00"], {}, ViewState()))


def test_the_node_fabric_column() -> None:
    summaries = node_fabric(port_statuses(cluster(), {"node-00/mlx5_1/1": 0.5}))
    assert (summaries["node-01"].up, summaries["node-01"].total) == (2, 3)
    assert summaries["node-00"].errors
    assert not summaries["node-01"].errors
    assert summaries["node-00"].worst_load == 0.95
    text = text_of(node_fabric_table(["node-00", "node-01", "node-03"], summaries, ViewState()))
    assert "2/3" in text
    assert "3/3" in text
    assert "node-03 no RDMA ports read" in text  # a node with GPUs and no port: said, not zero
    card = fabric_card(summaries)
    assert text_of(card) == "Fabric ports up 5/6 1 down"


def test_a_stale_nodes_ports_are_stale_not_busy_or_idle() -> None:
    statuses = port_statuses(cluster(), None, None, stale_nodes={"node-00"})
    stale = [s for s in statuses if s.nic.node == "node-00"]
    assert {s.problems for s in stale} == {("stale",)}
    assert {s.load for s in stale} == {None}  # its last traffic is not now's
    assert statuses[-1].nic.node == "node-01"  # an up port with no problem comes after the stale ones
    summaries = node_fabric(statuses)
    assert summaries["node-00"].stale
    assert text_of(fabric_card(summaries)) == "Fabric ports up 2/3 1 down · 3 stale"
    assert "stale: no recent reading" in text_of(node_fabric_table(["node-00"], summaries, ViewState()))
    assert stale_nodes([reading("node-00"), reading("node-01")], T0 + 200, 120) == {"node-00", "node-01"}
    assert stale_nodes([reading("node-00")], T0 + 60, 120) == set()


def test_the_ports_table_lists_every_port_with_its_state_and_alerts() -> None:
    alert = AlertState(
        fingerprint="f",
        rule="IbLinkDown",
        labels={"node": "node-01", "device": "mlx5_1", "port": "1", "gpus": "1"},
        annotations={},
        state="firing",
        active_since=0.0,
    )
    firing = firing_on_ports([alert])
    assert firing == {"node-01/mlx5_1/1": ["IbLinkDown"]}
    view = ports_table(port_statuses(cluster(), None, firing), ViewState())
    text = text_of(view)
    assert text.index("node-01 mlx5_1/1 IB 4X NDR down") < text.index("node-00 mlx5_0/1")
    assert "IbLinkDown" in text
    assert "degraded: 2X of 4X" in text


def test_a_jobs_ports_are_the_ones_next_to_its_gpus() -> None:
    ports = [*cluster(), nic("node-02", "mlx5_0", gpus=()), nic("node-02", "mlx5_1", gpus=())]
    mine = job_nics(ports, {"node-00": {1, 2}, "node-01": {0}, "node-02": {3}})
    assert [n.id for n in mine] == [
        "node-00/mlx5_1/1",
        "node-00/mlx5_2/1",
        "node-01/mlx5_0/1",
        "node-02/mlx5_0/1",  # no affinity known on node-02: all its ports
        "node-02/mlx5_1/1",
    ]


def test_a_jobs_traffic_is_summed_per_node_against_the_ports_rate() -> None:
    a, b = nic("node-00", "mlx5_0"), nic("node-00", "mlx5_1")

    def data(nic_id: str, tx: tuple[float | None, ...], rate: float) -> SeriesData:
        values = {
            "transmit_bytes_per_second": tx,
            "receive_bytes_per_second": tuple(None if v is None else v / 2 for v in tx),
            "rate_bytes_per_second": (rate,) * len(tx),
        }
        return SeriesData(nic_id, "raw", 10.0, (0.0, 10.0, 20.0)[: len(tx)], values, values, values)

    series = {a.id: data(a.id, (10e9, 20e9, None), NDR), b.id: data(b.id, (30e9, 0.0), NDR)}
    (traffic,) = node_traffic([a, b], series)
    assert traffic.times == (0.0, 10.0)  # no port reported at 20 s: a gap, not a zero
    assert traffic.transmit == (40e9, 20e9)
    assert traffic.rate == (2 * NDR, 2 * NDR)  # both ports reported at 10 s (one moved nothing)
    assert traffic.load == [0.4, 0.2]


def test_the_topology_places_each_port_beside_its_gpus() -> None:
    gpus = [reading("node-01", i) for i in range(8)]
    ports = [n for n in cluster() if n.node == "node-01"] + [nic("node-01", "mlx5_8", gpus=(), link_layer="Ethernet")]
    figure = as_data(node_topology(gpus, {}, ports))
    (nics,) = [t for t in figure["data"] if t.get("name") == "NICs"]
    labels = [t.split("<br>")[0] for t in nics["text"]]
    assert labels == ["<b>mlx5_0</b>", "<b>mlx5_1</b>", "<b>mlx5_2</b>", "<b>mlx5_8</b>"]
    assert nics["marker"]["color"][1] == DOWN_COLOR
    assert "down" in nics["text"][1]
    placed = {n.device: (x, y) for n, x, y in nic_positions(ports, {i: 1.5708 - 0.7854 * i for i in range(8)})}
    assert placed["mlx5_0"][1] > 1.7  # GPU 0 is at the top: its port above it
    assert placed["mlx5_8"] == (1.95, -1.95)  # next to no GPU: the bottom right corner
    assert figure["layout"]["height"] == 460
    plain = as_data(node_topology(gpus))
    assert plain["layout"]["height"] == 380  # no ports: the GPU topology as before


def test_the_ports_table_builds_only_the_rows_it_sends() -> None:
    many = [nic(f"node-{i:04d}", f"mlx5_{d}") for i in range(125) for d in range(8)]
    view = ports_table(port_statuses(many), ViewState())
    text = text_of(view)
    assert text.startswith("1000 ports · 0 down · problems first · showing the first 100")
    body = view.children[1].children[0].children[1]  # the table's wrapper, its table, its body
    assert len(body.children) == 100


def test_a_port_shared_by_a_gpu_pair_sits_between_them() -> None:
    angles = {0: math.pi / 2, 1: 0.0}  # GPU 0 at the top, GPU 1 to the right
    ((_, x, y),) = nic_positions([nic(device="mlx5_0", gpus=(0, 1))], angles)
    assert x == pytest.approx(y, abs=0.01)  # on the diagonal between them
    assert math.hypot(x, y) == pytest.approx(1.75)
