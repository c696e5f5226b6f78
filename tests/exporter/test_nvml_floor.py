"""The NVML source on the oldest nvidia-ml-py that pyproject allows (12.535), which lacks some later constants."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pynvml

from exporter.nvmlfields import VALUE_MEMBERS

ROOT = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter: the constant must be gone before any exporter module is imported.
_WITHOUT_UNSIGNED_SHORT = """
import json
import pynvml
del pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT  # absent before nvidia-ml-py 12.560
from exporter.nvml import NvmlSource
from exporter.nvmlfields import VALUE_MEMBERS
from tests.fakes.fake_nvml import FakeNvml

fake = FakeNvml.h100_node(gpus=2)
source = NvmlSource("node-a", nvml=fake, clock=fake.clock, xid_events=False)
try:
    snapshot = source.read()
finally:
    source.close()
gpu = snapshot.gpus[0]
print(json.dumps({
    "members": sorted(VALUE_MEMBERS.values()),
    "gpus": len(snapshot.gpus),
    "memory_temperature_celsius": gpu.memory_temperature_celsius,
    "power_watts": gpu.power_watts,
    "errors": snapshot.errors,
}))
"""


def test_unsigned_short_values_are_read_where_the_library_has_the_type() -> None:
    assert VALUE_MEMBERS[pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT] == "usVal"


def test_the_source_imports_and_reads_without_the_unsigned_short_constant() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_UNSIGNED_SHORT], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["members"] == ["dVal", "siVal", "sllVal", "uiVal", "ulVal", "ullVal"]
    assert found["gpus"] == 2
    assert found["memory_temperature_celsius"] == 70.0  # a field value: decoded through VALUE_MEMBERS
    assert found["power_watts"] == 612.5
    assert found["errors"] == {}
