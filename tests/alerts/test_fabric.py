"""The port rules on hand-made rounds: IbLinkDown, IbLinkFlapping, IbLinkDegraded, IbErrors, FabricCongestion,
FabricBandwidthSaturated; labels and summaries that name node, device, port, GPUs and job."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from gpulens.alerts.catalogue import (
    FABRIC_CONGESTION,
    FABRIC_SATURATED,
    IB_ERRORS,
    IB_LINK_DEGRADED,
    IB_LINK_DOWN,
    IB_LINK_FLAPPING,
)
from gpulens.alerts.fabricchecks import gpus_text
from gpulens.fabricmodel import NicReading

from .fabricsupport import HDR, NDR, down, fabric_snapshot, nic, rails
from .support import Feed, healthy_gpu, rule, training

JOB = {4: ("llm", "alice"), 5: ("llm", "alice")}


def run(rounds: Sequence[Sequence[NicReading]], name: str, jobs: Any = None, **thresholds: float) -> list[Any]:
    """The candidates of rule ``name`` after feeding one node's ports round by round (GPUs 0-7, ``jobs`` on them)."""
    feed = Feed()
    gpus = [training("node-03", i) if jobs and i in jobs else healthy_gpu("node-03", i) for i in range(8)]
    for ports in rounds:
        feed.add([fabric_snapshot("node-03", gpus, ports, jobs)])
    return feed.candidates([rule(name, **thresholds)])


def pair(**fields: Any) -> NicReading:
    """node-03 mlx5_2, next to GPUs 4-5 (an A100 node's second port)."""
    return nic("node-03", "mlx5_2", [4, 5], **fields)


def test_gpus_text() -> None:
    assert gpus_text((4, 5)) == "4-5"
    assert gpus_text((0, 1, 2, 6)) == "0-2,6"
    assert gpus_text((3,)) == "3"
    assert gpus_text(()) == ""


# ------------------------------------------------------------------------------------------------ IbLinkDown


def test_link_down_names_node_device_port_gpus_and_job() -> None:
    up = pair()
    [c] = run([[up]] * 3 + [[down(up, 1)]] * 2, IB_LINK_DOWN, JOB)
    assert c.labels == {
        "alertname": "IbLinkDown",
        "severity": "critical",
        "node": "node-03",
        "job_id": "llm",
        "device": "mlx5_2",
        "port": "1",
        "gpus": "4-5",
        "job": "llm",
    }
    assert c.summary.startswith("node-03 mlx5_2 port 1 (GPUs 4-5, job llm): InfiniBand link down since ")
    assert "(DOWN, Polling)" in c.summary
    assert c.value == 10.0  # down for one round interval so far


def test_link_down_without_a_job_has_no_job_label() -> None:
    up = pair()
    [c] = run([[up], [down(up)]], IB_LINK_DOWN)
    assert "job" not in c.labels
    assert "job_id" not in c.labels
    assert c.summary.startswith("node-03 mlx5_2 port 1 (GPUs 4-5): ")


def test_ports_never_up_or_disabled_are_not_down_alerts() -> None:
    never = down(pair())  # never seen up, never went down: an unused port
    assert run([[never]] * 3, IB_LINK_DOWN) == []
    disabled = replace(down(pair(), 2), phys_state="Disabled")
    assert run([[pair()], [disabled]], IB_LINK_DOWN) == []


def test_a_port_down_since_the_collector_started_counts_when_it_went_down_before() -> None:
    [c] = run([[down(pair(), 1)]] * 2, IB_LINK_DOWN)
    assert c.labels["device"] == "mlx5_2"


def test_a_roce_port_says_roce() -> None:
    up = pair(link_layer="Ethernet")
    [c] = run([[up], [down(up)]], IB_LINK_DOWN)
    assert "RoCE link down" in c.summary


# ------------------------------------------------------------------------------------------------ IbLinkFlapping


def flapping(downs: Sequence[int]) -> list[list[NicReading]]:
    """One round per value of the link_downed counter, the port up in each."""
    return [[pair(link_downed_total=d)] for d in downs]


def test_flapping_fires_above_flaps_max_in_the_window() -> None:
    [c] = run(flapping([0, 0, 1, 1, 2, 2, 3]), IB_LINK_FLAPPING, JOB)
    assert c.value == 3.0
    assert c.labels["gpus"] == "4-5"
    assert c.labels["job"] == "llm"
    assert c.summary == (
        "node-03 mlx5_2 port 1 (GPUs 4-5, job llm): InfiniBand link went down 3 times in the last 15m (up now)"
    )
    assert run(flapping([0, 1, 1, 2]), IB_LINK_FLAPPING) == []  # twice: not more than flaps_max
    assert run(flapping([0, 1, 1, 2, 3]), IB_LINK_FLAPPING, flaps_max=3) == []  # configurable


def test_flaps_older_than_the_window_do_not_count() -> None:
    rounds = flapping([0, 1, 2, 3] + [3] * 10)
    assert run(rounds, IB_LINK_FLAPPING, window_s=60.0) == []
    assert len(run(rounds, IB_LINK_FLAPPING, window_s=200.0)) == 1


def test_flaps_are_counted_from_down_rounds_without_the_counter() -> None:
    up = pair(link_downed_total=None)
    rounds = [[up], [down(up)], [up], [down(up)], [up], [down(up)], [up]]
    [c] = run(rounds, IB_LINK_FLAPPING)
    assert c.value == 3.0


def test_one_link_down_is_not_flapping() -> None:
    up = pair()
    assert run([[up]] * 3 + [[down(up, 1)]] * 10, IB_LINK_FLAPPING) == []


# ------------------------------------------------------------------------------------------------ IbLinkDegraded


def test_rate_below_the_ports_own_highest_is_degraded() -> None:
    rounds = [[pair()]] * 3 + [[pair(rate_bytes_per_second=HDR, link_speed="HDR")]]
    [c] = run(rounds, IB_LINK_DEGRADED, JOB)
    assert c.value == 0.5
    assert "25.0 GB/s instead of its 50.0 GB/s" in c.summary
    assert c.labels["job"] == "llm"


def test_fewer_lanes_than_before_is_degraded() -> None:
    [c] = run([[pair()], [pair(link_width=2)]], IB_LINK_DEGRADED)
    assert "2x lanes instead of 4x" in c.summary


def test_a_port_at_half_its_peers_rate_is_degraded_from_the_first_round() -> None:
    ports = rails("node-03")
    ports[2] = replace(ports[2], rate_bytes_per_second=NDR / 2)
    [c] = run([ports], IB_LINK_DEGRADED)
    assert c.labels["device"] == "mlx5_2"
    assert c.labels["gpus"] == "2"
    assert "50% of its peers' 50.0 GB/s" in c.summary


def test_healthy_ports_other_layers_and_down_ports_are_not_degraded() -> None:
    assert run([rails("node-03")] * 3, IB_LINK_DEGRADED) == []
    roce = nic("node-03", "mlx5_8", [], link_layer="Ethernet", rate_bytes_per_second=12.5e9)
    assert run([[*rails("node-03"), roce]], IB_LINK_DEGRADED) == []  # a 100G RoCE port beside NDR rails
    ports = rails("node-03")
    ports[2] = replace(down(ports[2], 1), rate_bytes_per_second=NDR / 8)
    assert run([ports], IB_LINK_DEGRADED) == []


# ------------------------------------------------------------------------------------------------ IbErrors


def errors(field: str, values: Sequence[int]) -> list[list[NicReading]]:
    return [[pair(**{field: v})] for v in values]


def test_climbing_symbol_errors_fire() -> None:
    [c] = run(errors("symbol_errors_total", [0, 20, 40, 60]), IB_ERRORS, JOB)
    assert c.value == 60.0
    assert c.summary == "node-03 mlx5_2 port 1 (GPUs 4-5, job llm): InfiniBand errors: 60 symbol errors in the last 10m"


def test_a_few_symbol_errors_do_not_fire() -> None:
    assert run(errors("symbol_errors_total", [3, 5, 8, 10]), IB_ERRORS) == []
    assert run(errors("symbol_errors_total", [5000] * 5), IB_ERRORS) == []  # an old count, not rising


def test_any_link_integrity_error_fires_and_receive_errors_above_their_limit() -> None:
    [c] = run(errors("local_link_integrity_errors_total", [0, 0, 1]), IB_ERRORS)
    assert "1 link integrity errors" in c.summary
    [c] = run(errors("receive_errors_total", [0, 50]), IB_ERRORS)
    assert "50 receive errors" in c.summary
    assert run(errors("receive_errors_total", [0, 5]), IB_ERRORS) == []


def test_a_counter_reset_counts_from_zero() -> None:
    [c] = run(errors("symbol_errors_total", [900, 950, 40]), IB_ERRORS)
    assert c.value == 40.0


# ------------------------------------------------------------------------------------------------ congestion


def busy(share: float, wait: float, **fields: Any) -> list[NicReading]:
    rate = NDR * share
    return [
        pair(transmit_bytes_per_second=rate, receive_bytes_per_second=rate, transmit_wait_per_second=wait, **fields)
    ]


def test_transmit_wait_far_above_the_ports_baseline_with_traffic_down_is_congestion() -> None:
    rounds = [busy(0.4, 800.0)] * 10 + [busy(0.13, 4e6)]
    [c] = run(rounds, FABRIC_CONGESTION, JOB)
    assert c.labels["device"] == "mlx5_2"
    assert c.labels["job"] == "llm"
    assert "transmit wait 4e+06/s, 5000x its usual 800/s" in c.summary
    assert "(13% of rate)" in c.summary


def test_congestion_keeps_its_baseline_when_it_lasts() -> None:
    rounds = [busy(0.4, 800.0)] * 10 + [busy(0.13, 4e6)] * 200  # longer than the 30-minute window
    assert len(run(rounds, FABRIC_CONGESTION)) == 1


def test_not_congestion_a_busy_port_a_mild_rise_or_no_baseline_yet() -> None:
    assert run([busy(0.4, 800.0)] * 10 + [busy(0.92, 4e6)], FABRIC_CONGESTION) == []  # traffic at its rate
    assert run([busy(0.4, 800.0)] * 10 + [busy(0.3, 5000.0)], FABRIC_CONGESTION) == []  # below the floor
    assert run([busy(0.4, 200_000.0)] * 10 + [busy(0.3, 1.2e6)], FABRIC_CONGESTION) == []  # only 6x its usual
    assert run([busy(0.4, 800.0)] * 3 + [busy(0.13, 4e6)], FABRIC_CONGESTION) == []  # 3 rounds: no baseline


def test_roce_cnps_far_above_baseline_are_congestion() -> None:
    roce = {"link_layer": "Ethernet", "rate_bytes_per_second": 12.5e9}
    rounds = [busy(0.1, 0.0, cnp_handled_per_second=10.0, **roce)] * 8
    rounds += [busy(0.03, 0.0, cnp_handled_per_second=60_000.0, **roce)]
    [c] = run(rounds, FABRIC_CONGESTION)
    assert "CNPs handled 6e+04/s" in c.summary


# ------------------------------------------------------------------------------------------------ saturation


def test_traffic_at_90_percent_of_rate_is_saturation() -> None:
    [c] = run([busy(0.93, 1000.0)], FABRIC_SATURATED, JOB)
    assert c.summary == "node-03 mlx5_2 port 1 (GPUs 4-5, job llm): InfiniBand TX at 46.5 GB/s, 93% of its 50.0 GB/s"
    assert c.labels["port"] == "1"


def test_a_checkpoint_write_and_a_down_port_are_not_saturation() -> None:
    checkpoint = [pair(transmit_bytes_per_second=0.45 * NDR, receive_bytes_per_second=0.002 * NDR)]
    assert run([checkpoint], FABRIC_SATURATED) == []
    assert run([[down(pair())]], FABRIC_SATURATED) == []


# ------------------------------------------------------------------------------------------------ confounders

PORT_RULES = (IB_LINK_DOWN, IB_LINK_FLAPPING, IB_LINK_DEGRADED, IB_ERRORS, FABRIC_CONGESTION, FABRIC_SATURATED)


def quiet_rounds(make: Callable[[int], list[NicReading]], count: int = 30) -> list[list[NicReading]]:
    return [make(i) for i in range(count)]


def test_healthy_ports_raise_nothing_under_any_port_rule() -> None:
    """A single-node job (no fabric traffic), a checkpoint burst, a job that never spans nodes: all ports healthy."""
    single = quiet_rounds(lambda i: rails("node-03"))
    checkpoint = quiet_rounds(
        lambda i: rails(
            "node-03",
            transmit_bytes_per_second=0.45 * NDR if 10 <= i < 16 else 0.0,
            receive_bytes_per_second=0.002 * NDR if 10 <= i < 16 else 0.0,
            transmit_wait_per_second=900.0 if 10 <= i < 16 else 0.0,
            symbol_errors_total=3,
        )
    )
    for rounds in (single, checkpoint):
        for name in PORT_RULES:
            assert run(rounds, name, {i: ("solo", "bob") for i in range(8)}) == [], name


def test_a_degraded_port_full_at_its_halved_rate_is_left_to_ib_link_degraded() -> None:
    halved = {"rate_bytes_per_second": NDR / 2, "link_width": 2}
    rounds = [busy(0.4, 800.0)] * 3 + [busy(0.475, 800.0, **halved)]  # 95% of the halved rate
    assert run(rounds, FABRIC_SATURATED) == []
    assert len(run(rounds, IB_LINK_DEGRADED)) == 1


def test_the_fabric_window_forgets_ports_not_seen_for_the_window() -> None:
    feed = Feed(window_s=60.0)
    gpus = [healthy_gpu("node-03", i) for i in range(8)]
    feed.add([fabric_snapshot("node-03", gpus, [pair()])])
    fabric = feed.history.fabric
    assert fabric.memory(pair().key).best_rate == NDR
    for _ in range(8):
        feed.add([fabric_snapshot("node-03", gpus)])
    assert fabric.nics == []
    assert fabric.port_series(pair().key) == ()
    assert fabric.memory(pair().key).best_rate is None  # gone with the port
