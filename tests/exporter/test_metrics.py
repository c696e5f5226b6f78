"""/metrics rendering: parsed with prometheus_client's parser and checked by the real promtool."""

from __future__ import annotations

import dataclasses
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpulens.exporter.metrics import ExporterHealth, LastXidTracker, render_metrics
from gpulens.model import GpuJob, MigReading
from tests.fakes.static_source import GIB, MigSnapshotSource, h100, node_snapshot

CONTRACT_FAMILIES = {
    "gpulens_gpu_info",
    "gpulens_gpu_up",
    "gpulens_gpu_utilization_ratio",
    "gpulens_gpu_memory_used_bytes",
    "gpulens_gpu_memory_total_bytes",
    "gpulens_gpu_temperature_celsius",
    "gpulens_gpu_slowdown_temperature_celsius",
    "gpulens_gpu_power_watts",
    "gpulens_gpu_power_limit_watts",
    "gpulens_gpu_energy_joules",
    "gpulens_gpu_clock_hertz",
    "gpulens_gpu_max_clock_hertz",
    "gpulens_gpu_throttle_active",
    "gpulens_gpu_pcie_throughput_bytes_per_second",
    "gpulens_gpu_pcie_link_generation",
    "gpulens_gpu_pcie_link_width",
    "gpulens_gpu_pcie_replays",
    "gpulens_gpu_nvlink_throughput_bytes_per_second",
    "gpulens_gpu_nvlink_links_active",
    "gpulens_gpu_nvlink_errors",
    "gpulens_gpu_ecc_errors",
    "gpulens_gpu_xid_errors",
    "gpulens_gpu_sm_active_ratio",
    "gpulens_gpu_tensor_active_ratio",
    "gpulens_gpu_dram_active_ratio",
    "gpulens_gpu_job_info",
    "gpulens_process_gpu_memory_bytes",
    "gpulens_exporter_build_info",
    "gpulens_exporter_collect_duration_seconds",
    "gpulens_exporter_collect_errors",
    "gpulens_exporter_last_collect_timestamp_seconds",
}


def parse(text: bytes) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text.decode())}


HEALTH = ExporterHealth(0.012, 1_700_000_000.0, {"nvml_not_supported": 3})


def test_every_contract_family_is_present_with_its_labels() -> None:
    snap = node_snapshot(gpus=8)
    snap = snap.replace(gpus=(h100("node-00", 0, snap.timestamp, xid_errors={79: 2}), *snap.gpus[1:]))
    families = parse(render_metrics(snap, HEALTH))
    assert set(families) >= CONTRACT_FAMILIES
    for name, samples in families.items():
        for sample in samples:
            assert "job" not in sample.labels, name  # Prometheus owns `job`
            if name.startswith("gpulens_gpu_") and name != "gpulens_gpu_job_info":
                assert {"node", "gpu", "uuid", "model"} <= set(sample.labels), name
    temps = {(s.labels["gpu"], s.labels["sensor"]): s.value for s in families["gpulens_gpu_temperature_celsius"]}
    assert temps[("3", "gpu")] == 61.0
    assert temps[("3", "memory")] == 70.0
    clocks = {s.labels["clock"] for s in families["gpulens_gpu_max_clock_hertz"]}
    assert clocks == {"sm", "memory"}
    xid = [s for s in families["gpulens_gpu_xid_errors"] if s.name.endswith("_total")]
    assert [(s.labels["gpu"], s.labels["xid"], s.value) for s in xid] == [("0", "79", 2.0)]
    errors = {s.labels["reason"]: s.value for s in families["gpulens_exporter_collect_errors"]}
    assert errors == {"nvml_not_supported": 3.0}
    jobs = families["gpulens_gpu_job_info"]
    assert {(s.labels["job_id"], s.labels["user"]) for s in jobs} == {("4242", "alice")}
    assert len(jobs) == 8
    procs = families["gpulens_process_gpu_memory_bytes"]
    assert {(s.labels["job_id"], s.labels["user"]) for s in procs} == {("4242", "alice")}
    assert procs[0].value == 69 * GIB


def test_process_memory_is_summed_per_job_and_gpu_unless_pids_are_asked_for(promtool: str) -> None:
    """By default no ``pid`` label (series that would come and go with every process): a job's processes on a GPU
    are one series, their sum; ``process_pids`` exports the per-process series, ``pid`` and ``command`` labelled."""
    snap = node_snapshot(gpus=2)
    first = snap.processes[0]
    second = dataclasses.replace(first, pid=first.pid + 100, memory_used_bytes=GIB, command="torchrun")
    other_job = dataclasses.replace(first, pid=first.pid + 200, memory_used_bytes=2 * GIB, job_id="77", user="bob")
    snap = snap.replace(processes=(*snap.processes, second, other_job))
    default = render_metrics(snap, HEALTH)
    summed = parse(default)["gpulens_process_gpu_memory_bytes"]
    assert all(set(s.labels) == {"node", "gpu", "uuid", "job_id", "user"} for s in summed)
    by_job = {(s.labels["gpu"], s.labels["job_id"]): s.value for s in summed}
    assert by_job == {("0", "4242"): 70 * GIB, ("0", "77"): 2 * GIB, ("1", "4242"): 69 * GIB}
    per_pid = render_metrics(snap, HEALTH, process_pids=True)
    processes = parse(per_pid)["gpulens_process_gpu_memory_bytes"]
    assert sorted((s.labels["pid"], s.labels["command"], s.value) for s in processes) == sorted(
        (str(p.pid), p.command, p.memory_used_bytes) for p in snap.processes
    )
    for body in (default, per_pid):
        result = promtool_check(promtool, body)
        assert result.returncode == 0, result.stdout + result.stderr


def test_throttle_reasons_are_one_series_per_reason() -> None:
    snap = node_snapshot(gpus=1)
    snap = snap.replace(gpus=(h100("node-00", 0, 0.0, throttle_reasons=0x20 | 0x40),))
    active = {s.labels["reason"]: s.value for s in parse(render_metrics(snap, HEALTH))["gpulens_gpu_throttle_active"]}
    assert len(active) == 9
    assert {r for r, v in active.items() if v == 1} == {"sw_thermal", "hw_thermal"}


def test_throttle_reasons_say_their_source_and_the_opt_in_fields_are_exported() -> None:
    inferred = h100("node-00", 0, 0.0, throttle_reasons=0x20, throttle_reasons_source="inferred")
    unsaid = h100("node-00", 1, 0.0, throttle_reasons=0x4, power_violation_seconds_total=99.5, p2p_peers_ok=5)
    snap = node_snapshot(gpus=2).replace(gpus=(inferred, unsaid))
    families = parse(render_metrics(snap, HEALTH))
    sources = {(s.labels["gpu"], s.labels["source"]) for s in families["gpulens_gpu_throttle_active"]}
    assert sources == {("0", "inferred"), ("1", "reported")}  # no source given: the driver reported them
    violations = families["gpulens_gpu_clock_violation_seconds"]  # the parser names a counter without _total
    assert len(violations) == 2 * 6  # six policies on each GPU
    power = {s.labels["gpu"]: s.value for s in violations if s.labels["policy"] == "power"}
    assert power == {"0": 12.5, "1": 99.5}
    assert sorted((s.labels["gpu"], s.labels["status"], s.value) for s in families["gpulens_gpu_p2p_peers"]) == [
        ("0", "ok", 7),
        ("1", "ok", 5),
    ]


def test_missing_values_are_omitted_not_zero_or_nan() -> None:
    snap = node_snapshot(gpus=2)
    snap = snap.replace(gpus=(h100("node-00", 0, 0.0, memory_temperature_celsius=None, power_watts=None), snap.gpus[1]))
    families = parse(render_metrics(snap, HEALTH))
    power = {s.labels["gpu"] for s in families["gpulens_gpu_power_watts"]}
    assert power == {"1"}
    sensors = {(s.labels["gpu"], s.labels["sensor"]) for s in families["gpulens_gpu_temperature_celsius"]}
    assert ("0", "memory") not in sensors
    assert ("0", "gpu") in sensors


def test_lost_gpu_reports_down_with_identity_only() -> None:
    snap = node_snapshot(gpus=2)
    lost = h100("node-00", 1, 0.0, up=False)
    lost = type(lost)(node=lost.node, gpu=1, uuid=lost.uuid, model=lost.model, timestamp=0.0, up=False)
    families = parse(render_metrics(snap.replace(gpus=(snap.gpus[0], lost), links=(), processes=(), jobs=()), HEALTH))
    assert {s.labels["gpu"]: s.value for s in families["gpulens_gpu_up"]} == {"0": 1.0, "1": 0.0}
    assert {s.labels["gpu"] for s in families["gpulens_gpu_utilization_ratio"]} == {"0"}


def test_mig_devices_are_exported() -> None:
    families = parse(render_metrics(MigSnapshotSource().snapshot, HEALTH))
    (sample,) = families["gpulens_gpu_mig_memory_total_bytes"]
    assert sample.labels["profile"] == "3g.40gb"
    assert sample.value == 40 * GIB


def test_without_a_snapshot_only_the_exporters_own_families_remain() -> None:
    families = parse(render_metrics(None, ExporterHealth()))
    assert {s.labels["version"] for s in families["gpulens_exporter_build_info"]}
    assert not any(name.startswith("gpulens_gpu_") and samples for name, samples in families.items())


def test_dcgm_compat_families_use_dcgm_units_and_labels() -> None:
    snap = node_snapshot(gpus=2)
    snap = snap.replace(gpus=(h100("node-00", 0, 0.0, xid_errors={48: 1}), snap.gpus[1]))
    tracker = LastXidTracker()
    families = parse(render_metrics(snap, HEALTH, dcgm_compat=True, last_xid=tracker.update(snap)))
    util = {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_GPU_UTIL"]}
    assert util["0"] == pytest.approx(97.0)
    fb_used = families["DCGM_FI_DEV_FB_USED"][0]
    assert fb_used.value == pytest.approx(70 * 1024)  # MiB
    assert set(fb_used.labels) == {
        "gpu",
        "UUID",
        "pci_bus_id",
        "device",
        "modelName",
        "Hostname",
        "DCGM_FI_DRIVER_VERSION",
        "container",
        "namespace",
        "pod",
    }
    assert fb_used.labels["device"] == "nvidia0"
    assert families["DCGM_FI_DEV_SM_CLOCK"][0].value == pytest.approx(1980)  # MHz
    assert families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"][0].value == pytest.approx(1.25e10)  # mJ
    assert families["DCGM_FI_PROF_NVLINK_TX_BYTES"][0].value == pytest.approx(1.5e11)  # B/s
    xids = {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_XID_ERRORS"]}
    assert xids == {"0": 48.0, "1": 0.0}
    for name in (
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
    ):
        assert len(families[name]) == 2, name


def test_last_xid_tracker_follows_the_newest_code() -> None:
    snap = node_snapshot(gpus=1)
    tracker = LastXidTracker()
    g = snap.gpus[0]
    assert tracker.update(snap) == {}
    assert tracker.update(snap.replace(gpus=(h100(g.node, 0, 0.0, xid_errors={79: 1}),))) == {g.uuid: 79}
    assert tracker.update(snap.replace(gpus=(h100(g.node, 0, 0.0, xid_errors={79: 1, 48: 1}),))) == {g.uuid: 48}
    assert tracker.update(snap.replace(gpus=(h100(g.node, 0, 0.0, xid_errors={79: 2, 48: 1}),))) == {g.uuid: 79}


def promtool_check(promtool: str, body: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=60, check=False)


def test_promtool_accepts_the_output_without_warnings(promtool: str) -> None:
    snap = node_snapshot(gpus=8)
    snap = snap.replace(gpus=(h100("node-00", 0, 0.0, xid_errors={79: 1}), *snap.gpus[1:]))
    result = promtool_check(promtool, render_metrics(snap, HEALTH))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_on_dcgm_compat_only_objects_to_dcgms_own_names(promtool: str) -> None:
    result = promtool_check(promtool, render_metrics(node_snapshot(gpus=2), HEALTH, dcgm_compat=True))
    # dcgm-exporter's own names break promtool's lint rules (`modelName` is camelCase, PCIE_REPLAY_COUNTER "includes
    # a type"); kept byte for byte for its dashboards. That is lint status 3, never a parse error (status 1), and
    # never a complaint about a gpulens family.
    problems = [ln for ln in (result.stdout + result.stderr).decode().splitlines() if ln.strip()]
    assert result.returncode == 3, problems
    assert problems
    assert all(ln.startswith("DCGM_FI_") for ln in problems), problems


def test_dcgm_compat_writes_kubernetes_pods_driver_and_mig_instances() -> None:
    g = h100("node-00", 0, 0.0, mig_enabled=True, driver_version="550.54.15")
    other = h100("node-00", 1, 0.0)
    snap = node_snapshot(gpus=2).replace(
        gpus=(g, other),
        jobs=(
            GpuJob(node="node-00", gpu=0, uuid=g.uuid, job_id="serving/llama-8b-0"),
            GpuJob(node="node-00", gpu=0, uuid=g.uuid, job_id="data-sci/jupyter-ana", mig_uuid=f"MIG-{g.uuid}/1"),
            GpuJob(node="node-00", gpu=1, uuid=other.uuid, job_id="pod/0c7e2f1a-9b3d-4e5f-8a6b-1c2d3e4f5a6b"),
        ),
        migs=(
            MigReading(
                "node-00",
                0,
                g.uuid,
                f"MIG-{g.uuid}/1",
                1,
                profile="3g.40gb",
                memory_used_bytes=10 * 1024**2 * 1024,
                memory_total_bytes=40 * 1024**3,
            ),
        ),
    )
    families = parse(render_metrics(snap, HEALTH, dcgm_compat=True))
    used = families["DCGM_FI_DEV_FB_USED"]
    gpu0 = [s for s in used if s.labels["gpu"] == "0" and "GPU_I_ID" not in s.labels]
    mig = [s for s in used if s.labels.get("GPU_I_ID") == "1"]
    assert len(gpu0) == len(mig) == 1
    assert (mig[0].labels["GPU_I_PROFILE"], mig[0].value) == ("3g.40gb", 10 * 1024)  # MiB
    assert (mig[0].labels["namespace"], mig[0].labels["pod"]) == ("data-sci", "jupyter-ana")  # its instance's pod
    free = [s for s in families["DCGM_FI_DEV_FB_FREE"] if s.labels.get("GPU_I_ID") == "1"]
    assert free[0].value == 30 * 1024
    assert (gpu0[0].labels["namespace"], gpu0[0].labels["pod"]) == ("serving", "llama-8b-0")
    assert gpu0[0].labels["DCGM_FI_DRIVER_VERSION"] == "550.54.15"
    gpu1 = next(s for s in used if s.labels["gpu"] == "1")
    assert (gpu1.labels["namespace"], gpu1.labels["pod"]) == ("", "0c7e2f1a-9b3d-4e5f-8a6b-1c2d3e4f5a6b")
    # dram_active_ratio stands in for MEM_COPY_UTIL (in %); GR_ENGINE_ACTIVE carries the utilization (0-1)
    assert g.dram_active_ratio is not None
    assert families["DCGM_FI_DEV_MEM_COPY_UTIL"][0].value == pytest.approx(g.dram_active_ratio * 100)
    assert families["DCGM_FI_PROF_GR_ENGINE_ACTIVE"][0].value == pytest.approx(g.utilization_ratio)


def test_dcgm_compat_writes_encoder_and_decoder_utilization_in_percent() -> None:
    snap = node_snapshot(gpus=1)
    snap = snap.replace(gpus=(h100("node-00", 0, 0.5, encoder_utilization_ratio=0.25, decoder_utilization_ratio=0.1),))
    families = parse(render_metrics(snap, HEALTH, dcgm_compat=True))
    assert [s.value for s in families["DCGM_FI_DEV_ENC_UTIL"]] == [pytest.approx(25.0)]
    assert [s.value for s in families["DCGM_FI_DEV_DEC_UTIL"]] == [pytest.approx(10.0)]
    assert [s.value for s in families["gpulens_gpu_encoder_utilization_ratio"]] == [pytest.approx(0.25)]
