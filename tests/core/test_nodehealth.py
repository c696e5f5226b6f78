"""A node's health (``gpulens.nodehealth``) from its readings, and ``gpulens node-health`` against a real exporter.

The unit tests weigh one finding at a time and together (the gravest state, the most intrusive action); the command
tests run ``gpulens exporter --source sim`` on a private port with a scenario whose GPU is lost from the start, a
healthy one, and no exporter at all, and check what the command prints and its exit status.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gpulens.fabricmodel import NicReading
from gpulens.kernelmodel import KernelView, XidAction
from gpulens.model import GpuReading, LinkReading, NodeSnapshot
from gpulens.nodehardware import GpuConfig, NodeHardware
from gpulens.nodehealth import DEGRADED, HEALTHY, UNHEALTHY, node_health
from gpulens.xidcatalogue import xid_action
from tests.conftest import free_port, http_get

ROOT = Path(__file__).resolve().parents[2]


def _gpu(index: int = 0, **fields: object) -> GpuReading:
    base = GpuReading(
        node="n1",
        gpu=index,
        uuid=f"GPU-{index}",
        model="H100",
        timestamp=0.0,
        pci_bus_id=f"00000000:{index + 3:02X}:00.0",
        pcie_link_width=16,
        pcie_link_width_max=16,
        ecc_uncorrected_errors_total=0,
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def _node(*gpus: GpuReading, links: tuple[LinkReading, ...] = (), nics: tuple[NicReading, ...] = ()) -> NodeSnapshot:
    return NodeSnapshot(node="n1", timestamp=0.0, source="test", gpus=gpus, links=links, nics=nics)


def test_a_node_of_healthy_gpus_is_healthy() -> None:
    health = node_health(_node(_gpu(0), _gpu(1)))
    assert (health.state, health.action, health.findings, health.exit_code) == (HEALTHY, "none", (), 0)


@pytest.mark.parametrize(
    ("fields", "state", "action", "words"),
    [
        ({"up": False}, UNHEALTHY, "reboot", "does not answer"),
        ({"remapped_rows_failure": True}, UNHEALTHY, "hardware-inspection", "row remapping failed"),
        ({"remapped_rows_pending": True}, DEGRADED, "reset-gpu", "remapped"),
        ({"ecc_uncorrected_errors_total": 3}, DEGRADED, "reset-gpu", "3 uncorrectable ECC errors"),
        ({"pcie_link_width": 8}, DEGRADED, "hardware-inspection", "x8 instead of x16"),
    ],
)
def test_each_gpu_finding_gives_its_state_and_action(
    fields: dict[str, object], state: str, action: str, words: str
) -> None:
    health = node_health(_node(_gpu(0), _gpu(1, **fields)))
    assert (health.state, health.action) == (state, action)
    (finding,) = health.findings
    assert finding.subject == "GPU 1 (00000000:04:00.0)"
    assert words in finding.reason


def test_nvlink_links_down_beside_links_up_degrade_the_node_but_a_gpu_without_nvlink_does_not() -> None:
    links = tuple(LinkReading("n1", 0, "GPU-0", k, active=k != 5) for k in range(18))
    links += tuple(LinkReading("n1", 1, "GPU-1", k, active=False) for k in range(4))
    health = node_health(_node(_gpu(0), _gpu(1), links=links))
    assert health.state == DEGRADED
    assert [f.text() for f in health.findings] == ["GPU 0: 1 of 18 NVLink links down (action: hardware-inspection)"]


def test_a_port_that_went_down_degrades_the_node_a_port_never_up_does_not() -> None:
    nics = (
        NicReading("n1", "mlx5_0", 1, up=False, link_downed_total=2),
        NicReading("n1", "mlx5_1", 1, up=False, link_downed_total=0),
    )
    health = node_health(_node(_gpu(0), nics=nics))
    assert [f.subject for f in health.findings] == ["mlx5_0 port 1"]
    assert health.state == DEGRADED


def test_a_hung_driver_makes_the_node_unhealthy() -> None:
    health = node_health(replace(_node(), nvml_hung_since=1_700_000_000.0))
    assert (health.state, health.action) == (UNHEALTHY, "reboot")
    assert [f.text() for f in health.findings] == [
        "node: the GPU driver is hung: an NVML call does not return (action: reboot)"
    ]


def test_the_gravest_state_and_the_most_intrusive_action_win() -> None:
    health = node_health(_node(_gpu(0, pcie_link_width=8), _gpu(1, up=False), _gpu(2, remapped_rows_pending=True)))
    assert health.state == UNHEALTHY
    assert health.action == "hardware-inspection"  # the narrow link's, more intrusive than the lost GPU's reboot
    assert health.findings[0].state == UNHEALTHY
    assert health.exit_code == 2


# --- the command against a real exporter ------------------------------------------------------------------------

SCENARIO = """
[cluster]
nodes = 1
gpus_per_node = 8
gpu_model = "H100-SXM5-80GB"
seed = 5
start = "2026-01-01T00:00:00Z"
duration = "2h"
step = "10s"
"""
LOST = SCENARIO + '\n[[faults]]\nkind = "gpu_lost"\ngpu = "node-00:3"\nat = "0m"\n'


@pytest.fixture
def exporter(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    scenario = tmp_path / "cluster.toml"
    scenario.write_text(request.param)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    command = [sys.executable, "-m", "gpulens.cli", "exporter", "--source", "sim", "--scenario", str(scenario)]
    command += ["--node", "node-00", "--listen", f"127.0.0.1:{port}", "--speed", "10"]
    log = (tmp_path / "exporter.log").open("wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    url = f"http://127.0.0.1:{port}/api/v1/snapshot"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if http_get(url, timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "exporter.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "exporter.log").read_text()
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()


def _node_health(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULENS_")}
    command = [sys.executable, "-m", "gpulens.cli", "node-health", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60, check=False)


@pytest.mark.parametrize("exporter", [LOST], indirect=True)
def test_node_health_names_the_lost_gpu_and_exits_2(exporter: str) -> None:
    result = _node_health("--url", exporter)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout.splitlines()[0] == "Unhealthy (node-00): action reboot"
    assert "GPU 3" in result.stdout
    assert "does not answer" in result.stdout
    doc = json.loads(_node_health("--url", exporter, "--json").stdout)
    assert (doc["node"], doc["state"], doc["action"]) == ("node-00", "Unhealthy", "reboot")
    assert [f["subject"].split(" (")[0] for f in doc["findings"]] == ["GPU 3"]


@pytest.mark.parametrize("exporter", [SCENARIO], indirect=True)
def test_node_health_of_a_healthy_node_exits_0(exporter: str) -> None:
    result = _node_health("--url", exporter)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == "Healthy (node-00): action none\n"


def test_node_health_without_an_exporter_says_why_in_one_line_and_exits_2() -> None:
    result = _node_health("--url", f"http://127.0.0.1:{free_port()}/api/v1/snapshot", "--timeout", "2")
    assert result.returncode == 2
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0] == "Unhealthy: action none"
    assert lines[1].startswith("  no verdict: the exporter at http://127.0.0.1:")
    assert "cannot be reached" in lines[1]


def test_a_password_is_never_taken_from_the_command_line() -> None:
    result = _node_health("--user", "gpulens")
    assert result.returncode == 2
    assert "--password-file" in result.stderr
    assert "Traceback" not in result.stderr


# --- XIDs and the node's hardware ---------------------------------------------------------------------------------


def test_an_xid_weighs_as_the_catalogue_says_and_an_escalated_one_asks_for_an_inspection() -> None:
    health = node_health(_node(_gpu(0, xid_errors={79: 1}), _gpu(1, xid_errors={13: 4})))
    assert health.state == UNHEALTHY
    lost = next(f for f in health.findings if f.subject.startswith("GPU 0"))
    assert (lost.state, lost.action) == (UNHEALTHY, xid_action(79))
    assert "XID 79" in lost.reason
    # an application's XID (13, check-application) does not make the node unhealthy on its own
    app = node_health(_node(_gpu(1, xid_errors={13: 4})))
    assert app.state in (HEALTHY, DEGRADED)
    assert app.action in ("none", "check-application")
    kernel = KernelView(actions=(XidAction("GPU-0", 48, "hardware-inspection", 5),))
    escalated = node_health(replace(_node(_gpu(0, xid_errors={48: 1})), kernel=kernel))
    assert escalated.action == "hardware-inspection"


def test_sxids_and_xids_on_no_gpu_come_from_the_kernel_view() -> None:
    kernel = KernelView(node_xids=(("0000:db:00", 79, 1),), sxids=(("0000:05:00.0", 24007, 1),))
    health = node_health(replace(_node(_gpu(0)), kernel=kernel))
    subjects = {f.subject: f for f in health.findings}
    assert "PCI 0000:db:00" in subjects
    assert subjects["NVSwitch 0000:05:00.0"].state in (DEGRADED, UNHEALTHY)
    assert health.state == UNHEALTHY


def test_the_hardware_against_what_it_should_be() -> None:
    hw = NodeHardware(
        pci_gpus=("0000:3b:00.0", "0000:3c:00.0"),
        missing_gpus=("0000:3c:00.0",),
        gpus_expected=8,
        ib_ports_expected=8,
        ib_ports_active=7,
        nvswitches=4,
        fabric_manager_running=False,
        peermem_loaded=False,
        gpus=(GpuConfig(0, "GPU-0", fabric_state="in_progress", fabric_ready=False),),
    )
    health = node_health(replace(_node(_gpu(0)), hardware=hw))
    reasons = [f.text() for f in health.findings]
    assert health.state == UNHEALTHY
    assert health.action == "hardware-inspection"
    assert any("PCI 0000:3c:00.0: a GPU on the PCI bus that NVML does not open" in r for r in reasons)
    assert any("2 GPUs on the node, 8 expected" in r for r in reasons)
    assert any("7 InfiniBand ports up, 8 expected" in r for r in reasons)
    assert any("nv-fabricmanager is not running" in r for r in reasons)
    assert any("GPU 0: NVLink fabric not ready (in_progress)" in r for r in reasons)
    assert any("nvidia_peermem" in r for r in reasons)
    assert node_health(replace(_node(_gpu(0)), hardware=NodeHardware(pci_gpus=("0000:3b:00.0",)))).state == HEALTHY
