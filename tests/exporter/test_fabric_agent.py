"""The node agent with the fabric: an exporter on 127.0.0.1 over the fake NVML and the fixture sysfs and /proc trees
serves the RDMA ports, the host and the jobs' cgroups in /api/v1/snapshot (schema 2) and in /metrics, promtool-clean.

The fixture node (tests/exporter/fabric/conftest.py): 8 H100s and mlx5_0..mlx5_7 in pairs under PCIe switches, a RoCE
port (mlx5_8) and a down port (mlx5_9); Slurm jobs 4242-4248 and a Kubernetes pod in cgroup v2.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import gpulens.exporter.agent
from gpulens.cli.main import main
from gpulens.clock import ManualClock
from gpulens.exporter.agent import ExporterOptions, build_routes, run_exporter
from gpulens.exporter.fabric.node import FABRIC_FAILED, FabricReader
from gpulens.exporter.metrics import ExporterHealth, render_metrics
from gpulens.exporter.nvml import NvmlSource
from gpulens.snapshotcodec import SNAPSHOT_SCHEMA, snapshot_from_json
from tests.conftest import http_get
from tests.exporter.fabric.conftest import GPU_BUS_IDS, STAT_LATER, SYSFS, V2_CGROUP, V2_PROC
from tests.exporter.test_metrics import promtool_check
from tests.fakes.fake_nvml import FakeNvml
from tests.fakes.static_source import node_snapshot

NODE = "gpu-node-01"
# GPU i runs one process of job 4242 + i (pids 4101-4107); GPU 7 the Kubernetes pod's
PIDS = (*range(4101, 4108), 5201)
JOBS = [*(str(4242 + i) for i in range(7)), "pod/7c1f2d9e-5b3a-4c8d-9e0f-1a2b3c4d5e6f"]
FABRIC_PREFIXES = ("ib_", "affinity_", "host_", "fabric_")


def fixture_nvml() -> FakeNvml:
    nvml = FakeNvml.h100_node(gpus=8)
    for index, gpu in enumerate(nvml.gpus):
        gpu.pci_bus_id = GPU_BUS_IDS[index]
        gpu.processes = [(PIDS[index], 1 << 30)]
    return nvml


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    """The fixture sysfs tree with the cgroup v2 hierarchy mounted at sys/fs/cgroup, as on a host."""
    root = tmp_path / "host"
    shutil.copytree(SYSFS, root, symlinks=True)
    shutil.copytree(V2_CGROUP, root / "sys" / "fs" / "cgroup", symlinks=True)
    return root


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    nvml = fixture_nvml()
    monkeypatch.setattr(gpulens.exporter.agent, "_nvml_source", lambda options: NvmlSource(options.node, nvml=nvml))
    return nvml


def options(root: Path, **changes: Any) -> ExporterOptions:
    values: dict[str, Any] = {
        "source": "nvml",
        "listen": "127.0.0.1:0",
        "interval_s": 0.2,
        "node": NODE,
        "node_given": True,
        "proc_root": str(V2_PROC),
        "sysfs_root": str(root),
    }
    return ExporterOptions(**(values | changes))


@pytest.fixture
def served(host_root: Path, fake_nvml: FakeNvml) -> Iterator[str]:
    """The base URL of a running exporter (run_exporter, as `gpulens exporter` runs it) once it has collected twice
    and its fabric reader (on its own thread) has read twice: the ports' rates are known."""
    announced: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(target=run_exporter, args=(options(host_root), announced.append, stop), daemon=True)
    thread.start()
    try:
        base = ""
        for _ in range(600):  # bounded: at most 600 polls
            if announced:
                base = announced[0].rsplit(" ", 1)[1].removesuffix("/metrics")
                status, _, body = http_get(base + "/api/v1/snapshot")
                doc = json.loads(body) if status == 200 else {}
                rates = [n for n in doc.get("nics", []) if n.get("transmit_bytes_per_second") is not None]
                if doc and doc["exporter"]["collections"] >= 2 and rates:
                    break
            time.sleep(0.05)
        assert base, "the exporter never announced itself"
        yield base
    finally:
        stop.set()
        thread.join(timeout=10)


def test_snapshot_serves_nics_host_and_jobs(served: str) -> None:
    status, _, body = http_get(served + "/api/v1/snapshot")
    assert status == 200
    doc = json.loads(body)
    assert doc["schema"] == SNAPSHOT_SCHEMA == 2
    assert doc["exporter"]["collections"] >= 2
    nics = {n["device"]: n for n in doc["nics"]}
    assert list(nics) == [f"mlx5_{i}" for i in range(10)]
    assert {d: nics[d]["gpus"] for d in ("mlx5_0", "mlx5_7", "mlx5_8", "mlx5_9")} == {
        "mlx5_0": [0],
        "mlx5_7": [7],
        "mlx5_8": [4, 5, 6, 7],
        "mlx5_9": [0, 1, 2, 3],
    }
    mlx5_0 = nics["mlx5_0"]
    assert (mlx5_0["transmit_bytes_total"], mlx5_0["receive_bytes_total"]) == (4000, 8000)  # words x 4
    assert (mlx5_0["up"], mlx5_0["rate_bytes_per_second"], mlx5_0["link_layer"]) == (True, 50e9, "InfiniBand")
    # second collection: the fixture's counters stood still, so the rates are known and zero
    assert (mlx5_0["transmit_bytes_per_second"], mlx5_0["receive_bytes_per_second"]) == (0.0, 0.0)
    assert nics["mlx5_8"]["cnp_handled_per_second"] == 0.0
    assert nics["mlx5_9"]["up"] is False
    host = doc["host"]
    assert (host["cpus"], host["memory_total_bytes"]) == (16, 2113322068 * 1024)
    assert [j["job_id"] for j in host["jobs"]] == JOBS
    job = host["jobs"][0]
    assert (job["cgroup"], job["cpu_seconds_total"], job["cpu_used_cores"]) == (
        "/system.slice/slurmstepd.scope/job_4242",
        123.456789,
        0.0,
    )
    snapshot = snapshot_from_json(doc)
    assert (len(snapshot.nics), snapshot.nics[0].node, len(snapshot.job_hosts)) == (10, NODE, 8)


def test_metrics_serve_the_fabric_families_promtool_clean(served: str, promtool: str) -> None:
    status, _, body = http_get(served + "/metrics")
    assert status == 200
    families = {f.name: f.samples for f in text_string_to_metric_families(body.decode())}
    info = {s.labels["device"]: s.labels for s in families["gpulens_nic_info"]}
    assert info["mlx5_0"] == {
        "node": NODE,
        "device": "mlx5_0",
        "port": "1",
        "link_layer": "InfiniBand",
        "gpus": "0",
        "pci_bus_id": "0000:17:00.0",
    }
    assert (info["mlx5_8"]["gpus"], info["mlx5_8"]["link_layer"]) == ("4,5,6,7", "Ethernet")

    def by_device(family: str) -> dict[str, float]:
        return {s.labels["device"]: s.value for s in families[family]}

    assert by_device("gpulens_nic_up")["mlx5_0"] == 1.0
    assert by_device("gpulens_nic_up")["mlx5_9"] == 0.0
    assert by_device("gpulens_nic_link_speed_bytes_per_second")["mlx5_0"] == 50e9
    assert by_device("gpulens_nic_transmit_bytes")["mlx5_0"] == 4000  # the parser drops _total from the name
    assert by_device("gpulens_nic_receive_bytes")["mlx5_0"] == 8000
    assert by_device("gpulens_nic_link_downed")["mlx5_0"] == 1
    assert by_device("gpulens_nic_cnp_handled")["mlx5_8"] == 1200
    assert "mlx5_0" not in by_device("gpulens_nic_cnp_handled")  # InfiniBand: no CNP counter, no series
    for name in (
        "gpulens_nic_transmit_packets",
        "gpulens_nic_receive_packets",
        "gpulens_nic_transmit_wait",
        "gpulens_nic_symbol_errors",
        "gpulens_nic_link_error_recovery",
        "gpulens_nic_receive_errors",
        "gpulens_nic_local_link_integrity_errors",
        "gpulens_nic_excessive_buffer_overrun_errors",
        "gpulens_nic_transmit_discards",
        "gpulens_nic_cnp_sent",
        "gpulens_nic_out_of_sequence",
    ):
        assert families[name], name
    host = {name: families[name][0] for name in families if name.startswith("gpulens_host_")}
    # The fixture's /proc/stat stands still, so the CPU ratios are unknown and omitted (see the test below).
    assert set(host) == {
        "gpulens_host_cpus",
        "gpulens_host_memory_available_bytes",
        "gpulens_host_memory_used_bytes",
        "gpulens_host_memory_total_bytes",
    }
    assert host["gpulens_host_memory_available_bytes"].labels == {"node": NODE}
    cpu = {s.labels["job_id"]: s for s in families["gpulens_job_cpu_seconds"]}
    assert sorted(cpu) == sorted(JOBS)
    assert cpu["4242"].labels == {"node": NODE, "job_id": "4242"}
    assert cpu["4242"].value == 123.456789
    assert {s.labels["job_id"] for s in families["gpulens_job_memory_used_bytes"]} == set(JOBS)
    assert families["gpulens_job_cpu_limit_cores"]
    assert families["gpulens_job_memory_limit_bytes"]
    reasons = {s.labels["reason"] for s in families.get("gpulens_exporter_collect_errors", [])}
    assert not [r for r in reasons if r.startswith(FABRIC_PREFIXES)], reasons
    result = promtool_check(promtool, body)
    assert result.returncode == 0, result.stdout + result.stderr


def test_cpu_ratios_and_rates_render_promtool_clean(host_root: Path, tmp_path: Path, promtool: str) -> None:
    proc = tmp_path / "proc"
    shutil.copytree(V2_PROC, proc, symlinks=True)
    clock = ManualClock()
    reader = FabricReader(NODE, sysfs_root=str(host_root), proc_root=str(proc), clock=clock)
    snapshot = node_snapshot(NODE, gpus=8).replace(processes=())
    reader.enrich(snapshot)
    shutil.copy(STAT_LATER, proc / "stat")  # 2,000 ticks later, 900 of them busy and 100 in iowait
    clock.advance(1.0)
    body = render_metrics(reader.enrich(snapshot), ExporterHealth())
    families = {f.name: f.samples for f in text_string_to_metric_families(body.decode())}
    assert families["gpulens_host_cpu_busy_ratio"][0].value == pytest.approx(0.45)
    assert families["gpulens_host_cpu_iowait_ratio"][0].value == pytest.approx(0.05)
    assert families["gpulens_host_cpu_busy_ratio"][0].labels == {"node": NODE}
    result = promtool_check(promtool, body)
    assert result.returncode == 0, result.stdout + result.stderr


def test_no_infiniband_class_gives_no_nics_and_no_error(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    (bare / "sys").mkdir(parents=True)  # no sys/class/infiniband, no cgroup hierarchy
    reader = FabricReader(NODE, sysfs_root=str(bare), proc_root=str(V2_PROC), clock=ManualClock())
    snapshot = reader.enrich(node_snapshot(NODE, gpus=8))
    assert snapshot.nics == ()
    assert snapshot.host is not None
    assert snapshot.host.memory_available_bytes is not None
    assert reader.errors == {}
    assert not [r for r in snapshot.errors if r.startswith(FABRIC_PREFIXES)]


def test_a_failing_reader_never_costs_the_gpus(host_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reader = FabricReader(NODE, sysfs_root=str(host_root), proc_root=str(V2_PROC), clock=ManualClock())

    def broken(self: object) -> None:
        raise RuntimeError("wedged HCA")

    monkeypatch.setattr("gpulens.exporter.fabric.ibports.IbPortReader.read", broken)
    before = node_snapshot(NODE, gpus=8)
    after = reader.enrich(before)
    assert after.gpus == before.gpus
    assert (after.nics, after.host) == ((), None)
    assert after.errors[FABRIC_FAILED] == 1
    assert reader.enrich(before).errors[FABRIC_FAILED] == 2  # counted every time, logged once


def test_unreadable_files_are_counted_not_raised(host_root: Path) -> None:
    counter = host_root / "sys" / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters" / "symbol_error"
    counter.write_text("garbage\n")
    reader = FabricReader(NODE, sysfs_root=str(host_root), proc_root=str(V2_PROC), clock=ManualClock())
    snapshot = reader.enrich(node_snapshot(NODE, gpus=8))
    assert snapshot.nics[0].symbol_errors_total is None
    assert snapshot.errors["ib_malformed"] == 1


def test_no_fabric_reads_gpus_only(host_root: Path, fake_nvml: FakeNvml) -> None:
    _routes, poller, close = build_routes(options(host_root, fabric=False))
    assert poller is not None
    try:
        poller.collect_once()
        snapshot = poller.published().snapshot
        assert snapshot is not None
        assert len(snapshot.gpus) == 8
        assert (snapshot.nics, snapshot.host, snapshot.job_hosts) == ((), None, ())
    finally:
        close()


def test_a_missing_sysfs_root_is_a_one_line_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-root"
    assert main(["exporter", "--source", "dcgm", "--sysfs-root", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--sysfs-root" in err
    assert "does not exist" in err
