"""The NVML source on the oldest nvidia-ml-py that pyproject allows (12.535), which lacks some later constants.

``pynvml_floor_names.txt`` lists the public names of pynvml 12.535.161. The floor test runs the source, GPM included,
in a fresh interpreter whose pynvml has every later name removed and 12.535's smaller GPM metrics struct (98 slots), so
a name the NVML modules read without a fallback fails here rather than on a node with an older nvidia-ml-py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pynvml

from gpulens.exporter.nvmlfields import VALUE_MEMBERS

ROOT = Path(__file__).resolve().parents[2]
FLOOR_NAMES = Path(__file__).with_name("pynvml_floor_names.txt")

# Runs in a fresh interpreter: the constant must be gone before any exporter module is imported.
_WITHOUT_UNSIGNED_SHORT = """
import json
import pynvml
del pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT  # absent before nvidia-ml-py 12.560
from gpulens.exporter.nvml import NvmlSource
from gpulens.exporter.nvmlfields import VALUE_MEMBERS
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


# Functions the fake offers that pynvml 12.535 lacks: as with the real module, the source must not find them there.
_AS_ON_THE_FLOOR = """
import ctypes, json, sys
import pynvml
floor = {line.strip() for line in open(sys.argv[1]) if line.strip() and not line.startswith("#")}
later = [name for name in dir(pynvml) if not name.startswith("_") and name not in floor]
for name in later:
    delattr(pynvml, name)


class FloorMetricsGet(pynvml._PrintableStructure):  # 12.535's struct: NVML_GPM_METRIC_MAX was 98
    _fields_ = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", pynvml.c_nvmlGpmSample_t),
        ("sample2", pynvml.c_nvmlGpmSample_t),
        ("metrics", pynvml.c_nvmlGpmMetric_t * 98),
    ]


pynvml.c_nvmlGpmMetricsGet_t, pynvml.NVML_GPM_METRIC_MAX = FloorMetricsGet, 98
from tests.fakes.fake_nvml import FakeNvml, h100_gpu, h200_gpu

for name in later:
    if name in vars(FakeNvml):
        delattr(FakeNvml, name)
from gpulens.exporter.nvml import NvmlSource

refusing = h100_gpu(1)
refusing.nvlink_error_totals = False
fake = FakeNvml([h200_gpu(0), refusing])
source = NvmlSource("node-a", nvml=fake, clock=fake.clock, xid_events=False)
try:
    source.read()
    fake.clock.advance(1)
    snapshot = source.read()
finally:
    source.close()
h200, h100 = snapshot.gpus
print(json.dumps({
    "removed": len(later),
    "sources": [snapshot.metric_sources[g.uuid] for g in snapshot.gpus],
    "pcie_tx": [g.pcie_tx_bytes_per_second for g in snapshot.gpus],
    "sm_active": h200.sm_active_ratio,
    "nvlink_tx": h200.nvlink_tx_bytes_per_second,
    "crc_flit": [g.nvlink_crc_flit_errors_total for g in snapshot.gpus],
    "temperature": [g.temperature_celsius for g in snapshot.gpus],
    "processes": len(snapshot.processes),
    "errors": snapshot.errors,
}))
"""


def test_the_source_reads_gpm_and_everything_else_with_the_floors_names() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", _AS_ON_THE_FLOOR, str(FLOOR_NAMES)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["removed"] > 500  # the names added after 12.535 are really gone
    assert found["sources"] == [
        {"pcie": "gpm", "nvlink": "gpm", "profiling": "gpm"},
        {"pcie": "sample", "nvlink": "counters"},
    ]
    assert found["pcie_tx"] == [8960 * 1024 * 1024, 1_200_000 * 1024]
    assert found["sm_active"] == 0.958
    assert found["nvlink_tx"] == 18 * 10 * 1024**3  # all 18 links' GPM metrics fit the floor's 98 slots
    assert found["crc_flit"] == [3, 3]  # the refused total summed over links
    assert found["temperature"] == [61.0, 61.0]  # nvmlDeviceGetTemperatureV is newer: nvmlDeviceGetTemperature
    assert found["processes"] == 2
    # The newer temperature call is missing from the older library: counted once, like an older driver's.
    assert found["errors"] == {"nvml_function_not_found": 1, "nvml_not_supported": 3}
