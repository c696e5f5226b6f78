"""The fault-kind registry: every kind is registered once, documented, exemplified and tested under its name."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from gpulens.exporter.sim import FAULT_KINDS, load_scenario
from gpulens.exporter.sim.faults import FAULT_TARGETS, PHASE_KINDS, AnyFaultParams
from tests.sim import test_fabric_faults, test_faults, test_hardware_faults

ROOT = Path(__file__).parents[2]


def test_each_kind_reads_its_own_params_struct() -> None:
    params = {k.params for k in FAULT_KINDS.values()}
    assert len(params) == len(FAULT_KINDS)
    assert set(AnyFaultParams.__args__) == params
    for name, kind in FAULT_KINDS.items():
        assert kind.name == name
        assert kind.params.__struct_config__.tag == name
        fields = {f.name for f in msgspec.structs.fields(kind.params)}
        assert "at" in fields
        assert kind.target in fields
        assert ("duration" in fields) is not kind.single_event


def test_targets_and_phase_priorities() -> None:
    assert set(FAULT_TARGETS.values()) == {"job", "gpu", "node", "nic"}
    priorities = [k.phase_priority for k in PHASE_KINDS]
    assert priorities == sorted(priorities)
    assert len(set(priorities)) == len(priorities)
    assert [k.name for k in PHASE_KINDS] == [
        "comm_stall",
        "hang_spinning",
        "hang_blocked",
        "hang_mixed",
        "idle_allocated",
        "nvlink_saturation",
        "ib_link_down",
        "ib_link_flap",
        "host_memory_pressure",
        "host_cpu_contention",
        "fabric_saturation",
        "rank_dead",
    ]


def test_every_kind_is_documented_with_its_target() -> None:
    text = (ROOT / "docs" / "scenarios.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (job|gpu|node|nic)\b[^|]* \|", text, re.MULTILINE))
    assert rows == dict(FAULT_TARGETS)


def test_the_faults_examples_have_every_kind() -> None:
    gpu = load_scenario(ROOT / "examples" / "scenarios" / "faults.toml")
    fabric = load_scenario(ROOT / "examples" / "scenarios" / "fabric.toml")
    assert {f.kind for f in fabric.faults} == {name for name, k in FAULT_KINDS.items() if k.fabric}
    assert {f.kind for f in gpu.faults} == {name for name, k in FAULT_KINDS.items() if not k.fabric}


def test_every_kind_has_a_signature_test() -> None:
    tests = [
        name
        for module in (test_faults, test_fabric_faults, test_hardware_faults)
        for name in dir(module)
        if name.startswith("test_")
    ]
    for kind in FAULT_KINDS:
        assert any(t == f"test_{kind}" or t.startswith(f"test_{kind}_") for t in tests), kind
