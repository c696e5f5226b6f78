"""Alert engine benchmark: replay speed, and detection quality over the simulator.

``alerts_replay_1h_8x8`` is one hour of an 8-node x 8-GPU cluster at a 10 s step through the simulator and the
whole engine (history, rules, state machine, grouping, in-memory outbox); ``alerts_engine_1h_8x8`` is the engine's
share of it (snapshots computed beforehand). The detection figures come from replaying the example scenarios and
generated ones (every fault kind and confounder, the three hang signatures, the healthy phases that look like a
hang, the fabric and host faults by port and by job, 2/4/8/32 nodes, four GPU models, several seeds and steps) and
matching the alerts that fired against what each fault calls for (tests/alerts/expect.py). They are reported per
fault (a fault is detected when every alert it calls for fired on the right subject) and per rule ((alert, subject)
pairs required, detected, fired, false); ``alerts_fabric_faults_*`` count the fabric and host fault kinds, and
``alerts_stalls_marked_with_their_link`` the stalls a down or flapping link explains, annotated with it as
their cause (members of its incident).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from bench import options
from gpulens.alerts.engine import AlertEngine
from gpulens.alerts.grouping import Route
from gpulens.alerts.notify.delivery import InMemoryOutbox
from gpulens.alerts.replay import rounds
from gpulens.alerts.rules import builtin_rules
from gpulens.exporter.sim import SimCluster, parse_scenario
from tests.alerts import scenarios
from tests.alerts.expect import BOUNDED, Outcome, run, tally

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "scenarios"
FABRIC_KINDS = (
    "ib_link_down",
    "ib_link_flap",
    "ib_degraded",
    "ib_errors",
    "fabric_congestion",
    "host_cpu_contention",
    "host_memory_pressure",
)


def replay_speed() -> tuple[float, float, int]:
    """(seconds for sim + engine, seconds for the engine alone, rounds) over one hour of demo.toml on 8 nodes."""
    text = (EXAMPLES / "demo.toml").read_text().replace("nodes = 4", "nodes = 8")
    scenario = parse_scenario(text, source="bench")
    began = time.perf_counter()
    recorded = list(rounds(SimCluster(scenario), scenario.start, scenario.end, scenario.step_s))
    sim = time.perf_counter() - began
    engine = AlertEngine(builtin_rules(), routes=[Route("ops")], outbox=InMemoryOutbox())
    began = time.perf_counter()
    for t, snapshots, targets in recorded:
        engine.process(t, snapshots, targets)
    spent = time.perf_counter() - began
    return sim + spent, spent, len(recorded)


def cases() -> list[tuple[str, str]]:
    out = [(path.name, path.read_text()) for path in sorted(EXAMPLES.glob("*.toml"))]
    seed = 100
    for nodes in (2, 8):
        for model in scenarios.MODELS:
            for topology in scenarios.TOPOLOGIES:
                if nodes < 4 and topology in ("wide", "spread"):
                    continue
                seed += 1
                step = ("10s", "15s", "30s")[seed % 3]
                out.append(
                    (f"job-{nodes}-{model}-{topology}", scenarios.job_faults(nodes, model, seed, topology, step))
                )
            seed += 1
            out.append((f"gpu-{nodes}-{model}", scenarios.gpu_faults(nodes, model, seed)))
            out.append((f"healthy-{nodes}-{model}", scenarios.healthy(nodes, model, seed)))
    for nodes, model, topology, step in (
        (2, "H100-SXM5-80GB", "pair", "10s"),
        (2, "L40S", "pair", "30s"),
        (8, "A100-SXM4-80GB", "two-node", "10s"),
        (8, "H200-SXM-141GB", "node", "15s"),
        (8, "L40S", "spread", "10s"),
        (32, "H100-SXM5-80GB", "wide", "10s"),
    ):
        seed += 1
        out.append((f"hangs-{nodes}-{model}-{topology}", scenarios.hangs(nodes, model, seed, topology, step)))
    for nodes, model, step in ((2, "H100-SXM5-80GB", "10s"), (2, "L40S", "30s"), (8, "A100-SXM4-80GB", "10s")):
        seed += 1
        out.append((f"phases-{nodes}-{model}", scenarios.phases(nodes, model, seed, step)))
    for nodes, model, step, by_job in (
        (4, "H100-SXM5-80GB", "10s", False),
        (4, "A100-SXM4-80GB", "15s", True),
        (4, "L40S", "10s", True),
        (8, "H200-SXM-141GB", "30s", False),
        (8, "L40S", "15s", False),
        (32, "H100-SXM5-80GB", "10s", True),
    ):
        seed += 1
        name = f"fabric-{nodes}-{model}" + ("-by-job" if by_job else "")
        out.append((name, scenarios.fabric_faults(nodes, model, seed, step, by_job)))
    for model in ("H100-SXM5-80GB", "L40S"):
        seed += 1
        out.append((f"job-32-{model}-wide", scenarios.job_faults(32, model, seed, "wide")))
        out.append((f"gpu-32-{model}", scenarios.gpu_faults(32, model, seed)))
        out.append((f"healthy-32-{model}", scenarios.healthy(32, model, seed)))
    return out


def main() -> int:
    options.no_arguments(__spec__.name if __spec__ else __name__, __doc__)
    total, engine, count = replay_speed()
    outcomes: list[Outcome] = []
    for name, text in cases():
        print(f"# {name}", file=sys.stderr, flush=True)
        outcome = run(text, name)
        if outcome.missed or outcome.false_alerts or outcome.refired:
            print(outcome.describe(), file=sys.stderr)
        outcomes.append(outcome)
    required = sum(o.required for o in outcomes)
    detected = sum(o.required - len(o.missed) for o in outcomes)
    delays = [d for o in outcomes for d in o.delays()]
    print(f"alerts_replay_1h_8x8: {total:.2f} s")
    print(f"alerts_engine_1h_8x8: {engine:.2f} s")
    print(f"alerts_engine_round_8x8: {engine / count * 1000:.2f} ms")
    print(f"alerts_scenarios: {len(outcomes)} scenarios")
    print(f"alerts_faults_expected: {required} alerts")
    print(f"alerts_faults_detected: {detected} alerts")
    print(f"alerts_detection_rate: {100.0 * detected / max(1, required):.1f} %")
    print(f"alerts_false_alerts: {sum(len(o.false_alerts) for o in outcomes)} alerts")
    print(f"alerts_refired: {sum(len(o.refired) for o in outcomes)} alerts")
    print(f"alerts_time_to_detect_median: {statistics.median(delays):.0f} s")
    for name in BOUNDED:
        mine = [d for o in outcomes for d in o.delays(name)]
        print(f"alerts_{name}_detected: {len(mine)} faults")
        print(f"alerts_{name}_time_to_detect_max: {max(mine):.0f} s")
    for signature in ("spinning", "blocked", "mixed"):
        mine = [
            a.starts_at - o.expected[i].start
            for o in outcomes
            for i, a in o.detected.items()
            if a.labels.get("signature") == signature
        ]
        print(f"alerts_stall_{signature}_time_to_detect: {min(mine):.0f}-{max(mine):.0f} s over {len(mine)}")
    kinds, rules = tally(outcomes)
    fabric = [kinds[k] for k in FABRIC_KINDS if k in kinds]
    print(f"alerts_fabric_faults_injected: {sum(k.injected for k in fabric)} faults")
    print(f"alerts_fabric_faults_detected: {sum(k.detected for k in fabric)} faults")
    caused = [a for o in outcomes for a in o.fired if a.alertname == "CommunicationStall" and "cause" in a.annotations]
    print(f"alerts_stalls_marked_with_their_link: {len(caused)} alerts")
    print("\n| fault kind | injected | calling for an alert | detected |\n|---|---|---|---|")
    for kind, k in sorted(kinds.items()):
        print(f"| `{kind}` | {k.injected} | {k.alerting} | {k.detected} |")
    sums = [sum(getattr(k, f) for k in kinds.values()) for f in ("injected", "alerting", "detected")]
    print(f"| all | {sums[0]} | {sums[1]} | {sums[2]} |")
    print("\n| rule | alerts required | detected | fired | false |\n|---|---|---|---|---|")
    for rule, r in sorted(rules.items()):
        print(f"| `{rule}` | {r.required} | {r.detected} | {r.fired} | {r.false} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
