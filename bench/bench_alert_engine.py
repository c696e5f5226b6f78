"""Alert engine at 1,000 nodes x 8 GPUs: the time of one round (history, every built-in rule, state machine,
grouping, in-memory outbox) over the simulator's 1,000-node scenario of ``bench_sim`` (training, inference,
notebooks, idle nodes), 10 s apart.

The simulator computes ``--distinct`` rounds once; the engine then takes ``--warm`` rounds to fill its history
(the distinct rounds again and again, their times moved on) and is timed over ``--rounds`` more: the CPU time of
each round (this process's, so a shared machine's other work does not count) and its wall time. By default the
history is full (the rules' 30-minute window), so each timed round also expires the oldest one: the steady state.
``--profile`` prints the hottest functions of the timed rounds (cProfile); ``--parts`` the CPU of each part of a
timed round (the history's GPUs, ports and jobs, each rule, the state machine), median per round, without a
profiler's overhead. Usage: ``python -m bench.bench_alert_engine [--warm 185] [--rounds 20] [--profile] [--parts]``.
"""

from __future__ import annotations

import cProfile
import dataclasses
import pstats
import statistics
import sys
import time
from typing import Any

from bench import options
from bench.bench_sim import NODES, scenario_text
from gpulens.alerts import engine as engine_module
from gpulens.alerts import rules as rules_module
from gpulens.alerts.engine import AlertEngine
from gpulens.alerts.grouping import Route
from gpulens.alerts.notify.delivery import InMemoryOutbox
from gpulens.alerts.replay import read_round
from gpulens.alerts.rules import builtin_rules
from gpulens.exporter.sim import SimCluster, parse_scenario
from gpulens.gcpause import tune_garbage_collector
from gpulens.model import NodeSnapshot, TargetHealth

STEP_S = 10.0
TARGET_MS = 100.0


def moved(
    snapshots: list[NodeSnapshot], targets: list[TargetHealth], shift: float
) -> tuple[list[NodeSnapshot], list[TargetHealth]]:
    """The round ``shift`` seconds later: the same readings, the snapshots' and targets' times moved on (the engine
    reads the round's time, never a reading's own timestamp, so the readings are shared)."""
    if not shift:
        return snapshots, targets
    snaps = [dataclasses.replace(s, timestamp=s.timestamp + shift) for s in snapshots]
    return snaps, [dataclasses.replace(t, timestamp=t.timestamp + shift) for t in targets]


def timed_parts(engine: AlertEngine) -> dict[str, list[float]]:
    """Time the parts of ``engine``'s rounds from now on: each call's CPU, by part (the history's, each rule's check,
    the state machine's); the lists fill as rounds run."""
    spent: dict[str, list[float]] = {}

    def wrap(name: str, call: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.process_time()
            try:
                return call(*args, **kwargs)
            finally:
                spent.setdefault(name, []).append(time.process_time() - began)

        return timed

    history = engine.history
    for owner, attribute, name in (
        (history, "add", "history_add"),
        (history.fabric, "add", "history_ports"),
        (history, "_summarise_jobs", "history_jobs"),
        (history, "_expire", "history_expire"),
    ):
        setattr(owner, attribute, wrap(name, getattr(owner, attribute)))
    checks = rules_module.CHECKS
    rules_module.CHECKS = {k: wrap(f"rule_{k}", check) for k, check in checks.items()}  # type: ignore[misc]
    engine_module.step = wrap("state_step", engine_module.step)  # type: ignore[assignment]
    return spent


def main() -> int:
    parser = options.parser("bench.bench_alert_engine", __doc__, "", "--rounds 40", "--profile")
    parser.add_argument("--distinct", type=int, default=6, help="rounds computed by the simulator (default 6)")
    parser.add_argument(
        "--warm", type=int, default=185, help="rounds fed before timing (default 185: the rules' 30-minute window full)"
    )
    parser.add_argument("--rounds", type=int, default=20, help="rounds timed (default 20)")
    parser.add_argument("--profile", action="store_true", help="print the hottest functions of the timed rounds")
    parser.add_argument("--parts", action="store_true", help="print the CPU of each part of a round (median)")
    parser.add_argument("--default-gc", action="store_true", help="leave Python's garbage collector as it starts")
    args = parser.parse_args()
    scenario = parse_scenario(scenario_text(), source="bench")
    sim = SimCluster(scenario)
    t0 = scenario.start + 25 * 60.0  # between checkpoints, as bench_sim
    print(f"# simulating {args.distinct} rounds of {NODES} nodes", file=sys.stderr, flush=True)
    distinct = [read_round(sim, t0 + i * STEP_S) for i in range(args.distinct)]
    gpus = sum(len(s.gpus) for s in distinct[0][0])
    engine = AlertEngine(builtin_rules(), routes=[Route("ops")], outbox=InMemoryOutbox())
    if not args.default_gc:
        tune_garbage_collector()  # as `gpulens collector` and `gpulens alerts run` do once started
    total = args.warm + args.rounds
    period = args.distinct * STEP_S
    times: list[float] = []
    cpus: list[float] = []
    profiler = cProfile.Profile() if args.profile else None
    parts: dict[str, list[float]] = {}
    print(f"# {args.warm} rounds to warm the history, {args.rounds} timed", file=sys.stderr, flush=True)
    for k in range(total):
        snapshots, targets = moved(*distinct[k % args.distinct], (k // args.distinct) * period)
        now = t0 + k * STEP_S
        timed = k >= args.warm
        if k == args.warm and args.parts:
            parts = timed_parts(engine)
        if timed and profiler is not None:
            profiler.enable()
        began, cpu = time.perf_counter(), time.process_time()
        engine.process(now, snapshots, targets)
        spent, cpu = time.perf_counter() - began, time.process_time() - cpu
        if timed and profiler is not None:
            profiler.disable()
        if timed:
            times.append(spent)
            cpus.append(cpu)
    median = statistics.median(cpus) * 1000
    print(f"alerts_engine_round_{NODES}x8_cpu_median: {median:.1f} ms ({gpus} GPUs, target <= {TARGET_MS:.0f} ms)")
    print(f"alerts_engine_round_{NODES}x8_wall_median: {statistics.median(times) * 1000:.1f} ms")
    print(f"alerts_engine_round_{NODES}x8_wall_max: {max(times) * 1000:.1f} ms")
    print(f"alerts_engine_round_{NODES}x8_history: {args.warm * STEP_S / 60:.0f} min")
    if args.parts:
        for name, spent in sorted(parts.items(), key=lambda item: -sum(item[1])):
            print(f"alerts_engine_part_{name}: {sum(spent) / args.rounds * 1000:.1f} ms per round")
    if profiler is not None:
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
