"""The job side of the fabric: JobInputBound, what a stalled multi-node job's NICs show, and a down link inhibiting
(annotating, never hiding) the stall it causes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from gpulens.alerts.base import Candidate
from gpulens.alerts.catalogue import COMMUNICATION_STALL, IB_LINK_DOWN, JOB_INPUT_BOUND, JOB_STRAGGLER
from gpulens.alerts.engine import AlertEngine
from gpulens.alerts.grouping import Route
from gpulens.alerts.incidents import annotate, form
from gpulens.alerts.rules import builtin_rules, evaluate
from gpulens.alerts.state import FIRING, cause_text, join_causes, step
from gpulens.fabricmodel import NicReading
from gpulens.model import GpuReading, NodeSnapshot

from .fabricsupport import NDR, down, fabric_snapshot, host, rails, share
from .support import T0, Feed, healthy_gpu, rule, stalled, training

INPUT = rule(JOB_INPUT_BOUND)
STALL = rule(COMMUNICATION_STALL)


def starving(node: str, index: int) -> GpuReading:
    """A rank waiting for its data loader: mostly idle, memory held, little traffic."""
    return healthy_gpu(node, index, utilization_ratio=0.15, memory_used_bytes=60 << 30, power_watts=150.0)


def job_round(
    make: Callable[[str, int], GpuReading],
    nodes: Sequence[str] = ("node-00",),
    job: str = "train",
    nic_fields: dict[str, Any] | None = None,
    host_fields: dict[str, Any] | None = None,
    share_fields: dict[str, Any] | None = None,
    nics: Callable[[str], list[NicReading]] | None = None,
) -> list[NodeSnapshot]:
    """One round of an 8-GPU-per-node job on ``nodes``, with its rails, hosts and cgroup shares."""
    out = []
    for node in nodes:
        ports = nics(node) if nics else rails(node, **(nic_fields or {}))
        out.append(
            fabric_snapshot(
                node,
                [make(node, i) for i in range(8)],
                ports,
                {i: (job, "alice") for i in range(8)},
                host(node, **(host_fields or {})),
                [share(node, job, **(share_fields or {}))],
            )
        )
    return out


def input_feed(rounds: int, **changes: Any) -> Feed:
    """A job busy for 10 rounds, then starving for ``rounds`` rounds with ``changes`` (host_fields, ...)."""
    feed = Feed()
    feed.repeat(10, lambda _: job_round(training))
    feed.repeat(rounds, lambda _: job_round(starving, **changes))
    return feed


# ------------------------------------------------------------------------------------------------ JobInputBound


def test_a_starving_job_with_its_cgroup_cpu_at_its_limit_is_input_bound() -> None:
    [c] = input_feed(3, share_fields={"cpu_used_cores": 15.8}).candidates([INPUT])
    assert c.labels == {
        "alertname": "JobInputBound",
        "severity": "warning",
        "node": "node-00",
        "job_id": "train",
        "user": "alice",
        "job": "train",
        "nodes": "node-00",
    }
    assert c.summary == ("job train: 8 GPUs at 15% waiting on the host: node-00 cgroup CPU 15.8 of its limit 16 cores")
    assert c.value == 0.15


def test_without_a_cpu_limit_the_nodes_cpus_are_the_limit() -> None:
    changes = {"share_fields": {"cpu_limit_cores": None, "cpu_used_cores": 62.0}}
    [c] = input_feed(3, **changes).candidates([INPUT])
    assert "cgroup CPU 62.0 of its node's 64 cores" in c.summary
    changes = {"share_fields": {"cpu_limit_cores": None, "cpu_used_cores": 20.0}}
    assert input_feed(3, **changes).candidates([INPUT]) == []


def test_memory_pressure_and_iowait_make_a_job_input_bound() -> None:
    pressure = {"cpu_iowait_ratio": 0.45, "memory_available_bytes": 1 << 34}  # 1.6% of 1 TiB
    [c] = input_feed(3, host_fields=pressure).candidates([INPUT])
    assert "node-00 iowait 45% with 1.6% memory available (memory pressure)" in c.summary


def test_not_input_bound_busy_gpus_an_idle_host_or_a_job_never_busy() -> None:
    feed = Feed()
    feed.repeat(5, lambda _: job_round(training, share_fields={"cpu_used_cores": 16.0}))
    assert feed.candidates([INPUT]) == []  # a CPU-hungry loader that keeps up
    assert input_feed(3).candidates([INPUT]) == []  # idle GPUs, the host idle too: not waiting on it
    notebook = Feed()
    notebook.repeat(5, lambda _: job_round(starving, share_fields={"cpu_used_cores": 16.0}))
    assert notebook.candidates([INPUT]) == []  # never busy: idle, not starved


def test_a_checkpoint_is_held_not_input_bound() -> None:
    """GPUs idle, the host busy serialising and waiting on storage, the NICs writing: a checkpoint."""
    writing = {"transmit_bytes_per_second": 0.45 * NDR, "receive_bytes_per_second": 0.002 * NDR}
    changes = {"share_fields": {"cpu_used_cores": 16.0}, "host_fields": {"cpu_iowait_ratio": 0.5}}
    feed = input_feed(3, nic_fields=writing, **changes)
    assert feed.candidates([INPUT]) == []
    [held] = evaluate([INPUT], feed.history, feed.now)
    assert held.hold
    assert held.labels == {"job_id": "train"}


# ------------------------------------------------------------------------------------------------ the stall's fabric


def rail_down(node: str, device: str = "mlx5_2", downs: int = 1) -> Callable[[str], list[NicReading]]:
    def make(n: str) -> list[NicReading]:
        ports = rails(n, link_downed_total=0)
        return [down(p, downs) if n == node and p.device == device else p for p in ports]

    return make


TWO = ("node-00", "node-01")


def stall_feed(nics: Callable[[str], list[NicReading]] | None, nodes: Sequence[str] = TWO, rounds: int = 6) -> Feed:
    feed = Feed()
    feed.repeat(30, lambda _: job_round(training, nodes))
    feed.repeat(rounds, lambda _: job_round(stalled, nodes, nics=nics))
    return feed


def test_a_multi_node_stall_names_the_down_port_of_the_job() -> None:
    [c] = stall_feed(rail_down("node-01")).candidates([STALL])
    assert c.summary.startswith("job train: 16 GPUs at 100% with no NVLink traffic for 50s; node-01 mlx5_2 (GPU 2) ")
    assert " is down since " in c.summary
    assert "The job's 16 NICs: 15 up" in c.description
    assert c.annotations["fabric"].startswith("The job's 16 NICs: 15 up")


def test_a_multi_node_stall_counts_the_flaps_of_a_port() -> None:
    def flapped(node: str) -> list[NicReading]:
        ports = rails(node, link_downed_total=0)
        return [replace(p, link_downed_total=3) if node == "node-01" and p.device == "mlx5_2" else p for p in ports]

    feed = Feed()
    feed.repeat(30, lambda _: job_round(training, TWO, nics=lambda n: rails(n, link_downed_total=0)))
    feed.repeat(6, lambda _: job_round(stalled, TWO, nics=flapped))
    [c] = feed.candidates([STALL])
    assert c.summary == (
        "job train: 16 GPUs at 100% with no NVLink traffic for 50s; node-01 mlx5_2 (GPU 2) went down 3 times in the "
        "last 10m"
    )
    assert "The job's 16 NICs: 16 up" in c.description


def test_a_stall_with_healthy_nics_or_on_one_node_keeps_its_summary() -> None:
    [c] = stall_feed(None).candidates([STALL])
    assert c.summary == "job train: 16 GPUs at 100% with no NVLink traffic for 50s"
    assert "The job's 16 NICs: 16 up" in c.description
    [c] = stall_feed(rail_down("node-00"), nodes=("node-00",)).candidates([STALL])
    assert c.summary == "job train: 8 GPUs at 100% with no NVLink traffic for 50s"  # a single-node job: no fabric
    assert "fabric" not in c.annotations


# ------------------------------------------------------------------------------------------------ inhibition


def test_a_down_link_explains_the_stall_it_causes_one_incident_one_message() -> None:
    route = Route("ops", group_by=("alertname",), group_wait_s=0.0, incidents=True)
    engine = AlertEngine(builtin_rules(), routes=[route])
    now = T0
    for _ in range(30):
        engine.process(now, job_round(training, TWO, nics=lambda n: rails(n, link_downed_total=0)), [])
        now += 10.0
    notified: list[str] = []
    messages = []
    for _ in range(40):
        outcome = engine.process(now, job_round(stalled, TWO, nics=rail_down("node-01")), [])
        notified += [a.rule for n in outcome.notifications for a in n.alerts if a.state == FIRING]
        messages += outcome.notifications
        now += 10.0
    states = {s.rule: s for s in engine.states.values()}
    link, stall = states[IB_LINK_DOWN], states[COMMUNICATION_STALL]
    assert link.state == stall.state == FIRING
    assert link.muted is None
    assert link.labels["job_id"] == "train"
    assert link.labels["device"] == "mlx5_2"
    assert stall.annotations["cause"] == "IbLinkDown node-01 mlx5_2"  # shown, marked with its cause
    assert "node-01 mlx5_2 (GPU 2) is down since" in stall.summary
    (incident,) = [i for i in engine.incidents.values() if i.is_open]
    assert stall.annotations["incident"] == link.annotations["incident"] == incident.id
    assert (incident.culprit.kind, incident.culprit.node, incident.culprit.device) == ("port", "node-01", "mlx5_2")
    assert incident.jobs == ("train",)
    # the link opened the incident alone; the stall it explains joined it without a message of its own
    assert [(m.group_labels["incident"], m.group_labels["incident_event"]) for m in messages] == [
        (incident.id, "opened")
    ]
    assert IB_LINK_DOWN in notified
    assert COMMUNICATION_STALL not in notified


def _state(rule_name: str, **labels: str) -> Candidate:
    return Candidate(rule_name, {"alertname": rule_name, "severity": "critical", **labels}, 1.0, rule_name, "")


def test_a_shared_port_explains_the_stall_and_slowness_of_each_of_its_jobs_and_no_other() -> None:
    rules = {r.name: r for r in builtin_rules()}
    link = _state(IB_LINK_DOWN, node="n1", device="mlx5_1", port="2", job_id="a,b", job="a,b")
    stall_b = _state(COMMUNICATION_STALL, job_id="b", signature="spinning")
    stall_c = _state(COMMUNICATION_STALL, job_id="c", signature="spinning")
    straggler_b = _state(JOB_STRAGGLER, job_id="b", node="n1", gpu="1")
    fired = step({}, [link, stall_b, stall_c, straggler_b], rules, 0.0)
    states = dict(step(fired.states, [link, stall_b, stall_c, straggler_b], rules, 1000.0).states)
    incidents = form({}, states, 1000.0)
    annotate(states, incidents)
    by = {(s.rule, s.labels["job_id"]): s for s in states.values()}
    port, other = sorted(incidents.values(), key=lambda i: i.culprit.kind != "port")
    assert (port.culprit.kind, port.culprit.node, port.culprit.device, port.culprit.port) == (
        "port",
        "n1",
        "mlx5_1",
        "2",
    )
    assert port.jobs == ("a", "b")
    assert {m.rule for m in port.members} == {IB_LINK_DOWN, COMMUNICATION_STALL, JOB_STRAGGLER}
    assert by[(COMMUNICATION_STALL, "b")].annotations["cause"] == "IbLinkDown n1 mlx5_1 port 2"
    assert by[(JOB_STRAGGLER, "b")].annotations["cause"] == "IbLinkDown n1 mlx5_1 port 2"
    assert (other.culprit.kind, other.culprit.job_id) == ("job", "c")  # another job's stall: its own incident
    assert "cause" not in by[(COMMUNICATION_STALL, "c")].annotations
    assert all(s.muted is None for s in states.values())  # shown and sent to Alertmanager, grouped by incident


def test_cause_text() -> None:
    fired = step({}, [_state("ExporterDown", node="n3")], {r.name: r for r in builtin_rules()}, 0.0)
    [s] = fired.states.values()
    assert cause_text(s) == "ExporterDown n3"


def test_causes_of_one_rule_on_one_node_are_joined() -> None:
    assert join_causes(["IbLinkDown n0 mlx5_0", "IbLinkDown n0 mlx5_1", "IbLinkDown n1 mlx5_0"]) == (
        "IbLinkDown n0 mlx5_0,mlx5_1; IbLinkDown n1 mlx5_0"
    )
    assert join_causes(["ExporterDown n3"]) == "ExporterDown n3"
    assert join_causes([]) == ""


def test_a_stall_with_many_ports_down_names_the_first_and_counts_the_rest() -> None:
    def all_down(node: str) -> list[NicReading]:
        return [down(p, 1) for p in rails(node, link_downed_total=0)] if node == "node-01" else rails(node)

    [c] = stall_feed(all_down).candidates([STALL])
    assert c.summary.endswith("node-01 mlx5_0 (GPU 0) is down since 00:05 UTC; 7 more of its NICs down or flapping")
    assert c.description.count("is down since") == 8
