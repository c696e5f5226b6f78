"""``promround.counters_changed``: the GPUs whose error counters changed within an error rule's window, told from
the engine's history before a round joins it. A filtered round over Prometheus reads only those GPUs whole for the
error rules, so they must include every GPU the rules then fire on (the parity of whole and filtered rounds over a
real Prometheus is tests/storage/test_prometheus_alert_rounds.py).
"""

from __future__ import annotations

import random
from dataclasses import replace

from gpulens.alerts import checks
from gpulens.alerts.catalogue import ECC_UNCORRECTABLE, NVLINK_ERRORS, PCIE_DEGRADED, XID_ERROR
from gpulens.alerts.history import History
from gpulens.alerts.promround import counters_changed
from gpulens.alerts.rules import builtin_rules
from gpulens.model import GpuReading, NodeSnapshot

RULES = builtin_rules({NVLINK_ERRORS: {"window_s": 120.0}})  # PcieLinkDegraded keeps 60 s, XidError 600 s
ERROR_RULES = [r for r in RULES if r.name in (PCIE_DEGRADED, NVLINK_ERRORS, ECC_UNCORRECTABLE, XID_ERROR)]
CHECKS = {
    PCIE_DEGRADED: checks.pcie_degraded,
    NVLINK_ERRORS: checks.nvlink_errors,
    ECC_UNCORRECTABLE: checks.ecc_uncorrectable,
    XID_ERROR: checks.xid_error,
}


def _gpu(uuid: str, t: float, **fields: object) -> GpuReading:
    base = GpuReading(
        node="n0",
        gpu=int(uuid[-1], 16),
        uuid=uuid,
        model="H100-SXM5-80GB",
        timestamp=t,
        pcie_link_generation=5,
        pcie_link_generation_max=5,
        pcie_link_width=16,
        pcie_link_width_max=16,
        nvlink_links_active=18,
        pcie_replays_total=5,
        nvlink_crc_flit_errors_total=0,
        nvlink_replay_errors_total=0,
        nvlink_recovery_errors_total=0,
        ecc_uncorrected_errors_total=0,
        xid_errors={},
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def _round(history: History, t: float, gpus: list[GpuReading]) -> set[str]:
    """``counters_changed`` for this round, then the round joins the history."""
    changed = counters_changed(ERROR_RULES, history, t, gpus)
    history.add(t, [NodeSnapshot(node="n0", timestamp=t, source="test", gpus=tuple(gpus))])
    return changed


def test_a_counter_that_changed_names_its_gpu_within_its_rules_window_only() -> None:
    history = History()
    assert _round(history, 0.0, [_gpu("gpu-a", 0.0), _gpu("gpu-b", 0.0)]) == set()  # nothing to compare with
    assert _round(history, 30.0, [_gpu("gpu-a", 30.0), _gpu("gpu-b", 30.0)]) == set()
    assert _round(history, 60.0, [_gpu("gpu-a", 60.0, nvlink_replay_errors_total=2), _gpu("gpu-b", 60.0)]) == {"gpu-a"}
    assert (
        counters_changed([r for r in RULES if r.name == PCIE_DEGRADED], history, 90.0, [_gpu("gpu-a", 90.0)]) == set()
    )
    for t in (90.0, 120.0, 150.0):  # NvlinkErrors' window (120 s) still starts before the change
        gpus = [_gpu("gpu-a", t, nvlink_replay_errors_total=2), _gpu("gpu-b", t)]
        assert _round(history, t, gpus) == {"gpu-a"}, t
    # from 180 s the window starts at the round that saw the change: nothing grew within it
    assert _round(history, 180.0, [_gpu("gpu-a", 180.0, nvlink_replay_errors_total=2), _gpu("gpu-b", 180.0)]) == set()


def test_each_error_rule_weighs_its_own_counters_over_its_own_window() -> None:
    history = History()
    _round(history, 0.0, [_gpu(f"gpu-{c}", 0.0) for c in "abcd"])
    changed = _round(
        history,
        30.0,
        [
            _gpu("gpu-a", 30.0, pcie_replays_total=900),
            _gpu("gpu-b", 30.0, ecc_uncorrected_errors_total=1),
            _gpu("gpu-c", 30.0, xid_errors={79: 1}),  # a new XID series
            _gpu("gpu-d", 30.0),
        ],
    )
    assert changed == {"gpu-a", "gpu-b", "gpu-c"}
    # past PcieLinkDegraded's 60 s, within EccUncorrectable's and XidError's 600 s
    later = [
        _gpu("gpu-a", 120.0, pcie_replays_total=900),
        _gpu("gpu-b", 120.0, ecc_uncorrected_errors_total=1),
        _gpu("gpu-c", 120.0, xid_errors={79: 1}),
    ]
    assert _round(history, 120.0, later) == {"gpu-b", "gpu-c"}


def test_a_gpu_missing_from_the_windows_first_round_is_compared_with_its_oldest_reading_in_it() -> None:
    history = History()
    _round(history, 0.0, [_gpu("gpu-a", 0.0)])
    _round(history, 30.0, [_gpu("gpu-a", 30.0), _gpu("gpu-b", 30.0)])  # gpu-b joins
    assert _round(history, 60.0, [_gpu("gpu-a", 60.0), _gpu("gpu-b", 60.0, ecc_uncorrected_errors_total=3)]) == {
        "gpu-b"
    }


def test_every_gpu_an_error_rule_fires_on_was_named_before_the_round() -> None:
    """Random counter walks (resets, growth, new XIDs, GPUs missing rounds) over 60 rounds of 12 GPUs: each rule
    fires only on GPUs ``counters_changed`` named for the round, and fires at all (the walk is not idle)."""
    rng = random.Random(7)
    history = History()
    counters = {
        f"gpu-{i:x}": {"pcie_replays_total": 0, "nvlink_replay_errors_total": 0, "ecc_uncorrected_errors_total": 0}
        for i in range(12)
    }
    xids: dict[str, dict[int, int]] = {uuid: {} for uuid in counters}
    fired: set[str] = set()
    for k in range(60):
        t = 30.0 * k
        gpus = []
        for uuid, values in counters.items():
            for name in values:
                roll = rng.random()
                values[name] = 0 if roll < 0.03 else values[name] + (rng.choice((1, 500)) if roll < 0.15 else 0)
            if rng.random() < 0.05:
                code = rng.choice((79, 48, 13))
                xids[uuid][code] = xids[uuid].get(code, 0) + 1
            if rng.random() < 0.1:
                continue  # the GPU misses this round
            gpus.append(_gpu(uuid, t, xid_errors=dict(xids[uuid]), **values))
        named = {rule.name: counters_changed([rule], history, t, gpus) for rule in ERROR_RULES}
        history.add(t, [NodeSnapshot(node="n0", timestamp=t, source="test", gpus=tuple(gpus))])
        for rule in ERROR_RULES:
            on = {c.labels["uuid"] for c in CHECKS[rule.name](rule, history, t)}
            assert on <= named[rule.name], (k, rule.name, on - named[rule.name])
            fired |= {f"{rule.name}:{u}" for u in on}
    assert {f.partition(":")[0] for f in fired} == {PCIE_DEGRADED, NVLINK_ERRORS, ECC_UNCORRECTABLE, XID_ERROR}
