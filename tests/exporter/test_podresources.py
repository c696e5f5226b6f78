"""The kubelet pod-resources mapper against a stand-in kubelet: a real gRPC server of the v1 proto on a unix socket."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpulens.config import ConfigError
from gpulens.exporter.agent import ExporterOptions, _pod_mapper
from gpulens.exporter.metrics import ExporterHealth, render_metrics
from gpulens.exporter.podresources import api_pb2, api_pb2_grpc
from gpulens.exporter.podresources.client import KubeletClient, KubeletError
from gpulens.exporter.podresources.mapper import UNAVAILABLE, UNKNOWN_DEVICE, PodMapper
from gpulens.extras import MissingExtraError, require_k8s
from gpulens.model import GpuJob, GpuReading, MigReading, NodeSnapshot, ProcessReading

NODE = "gpu-07"


def _eventually(predicate: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    """Poll ``predicate`` until it holds; the timeout only stops a broken test from hanging."""
    stop = time.monotonic() + timeout_s
    while time.monotonic() < stop:
        if predicate():
            return True
        time.sleep(0.02)
    return False


UUIDS = [f"GPU-{i}a2b3c4d-0000-1111-2222-33334444555{i}" for i in range(4)]
MIG = "MIG-7e4f6a1b-2c3d-5e6f-8a9b-0c1d2e3f4a5b"
POD_UID = "0c7e2f1a-9b3d-4e5f-8a6b-1c2d3e4f5a6b"


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """Answers List from ``pods`` and GetAllocatableResources from ``allocatable`` (None: not served)."""

    def __init__(self) -> None:
        self.pods: list[api_pb2.PodResources] = []
        self.allocatable: list[api_pb2.ContainerDevices] | None = None
        self.list_calls = 0

    def List(self, request: Any, context: Any) -> api_pb2.ListPodResourcesResponse:
        self.list_calls += 1
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)

    def GetAllocatableResources(self, request: Any, context: Any) -> api_pb2.AllocatableResourcesResponse:
        if self.allocatable is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method")  # as a kubelet before 1.21 answers
        return api_pb2.AllocatableResourcesResponse(devices=self.allocatable, cpu_ids=[0, 1])


def pod(namespace: str, name: str, *containers: tuple[str, str, list[str]]) -> api_pb2.PodResources:
    return api_pb2.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            api_pb2.ContainerResources(
                name=c, devices=[api_pb2.ContainerDevices(resource_name=r, device_ids=ids)], cpu_ids=[3]
            )
            for c, r, ids in containers
        ],
    )


def snapshot(processes: tuple[ProcessReading, ...] = (), jobs: tuple[GpuJob, ...] = ()) -> NodeSnapshot:
    gpus = tuple(GpuReading(NODE, i, u, "NVIDIA H100", 100.0, mig_enabled=i == 3) for i, u in enumerate(UUIDS))
    migs = (MigReading(NODE, 3, UUIDS[3], MIG, gpu_instance_id=5, profile="1g.10gb"),)
    return NodeSnapshot(NODE, 100.0, "test", gpus=gpus, migs=migs, processes=processes, jobs=jobs)


def mapper(path: str) -> tuple[PodMapper, KubeletClient]:
    client = KubeletClient(path, timeout_s=5.0)
    return PodMapper(client, clock=lambda: 0.0), client


def test_a_gpu_allocated_to_a_pod_is_held_before_any_process_runs(kubelet: tuple[Kubelet, str]) -> None:
    server, path = kubelet
    server.pods = [
        pod("ml", "train-0", ("trainer", "nvidia.com/gpu", [UUIDS[0], UUIDS[1]])),
        pod("web", "nginx", ("nginx", "example.com/foo", ["dev-1"])),  # not a GPU: ignored
        pod("idle", "no-devices"),
    ]
    mapped, client = mapper(path)
    try:
        result = mapped.enrich(snapshot())
    finally:
        client.close()
    assert [(j.gpu, j.job_id, j.namespace, j.pod, j.container, j.pod_uid) for j in result.jobs] == [
        (0, "ml/train-0", "ml", "train-0", "trainer", None),
        (1, "ml/train-0", "ml", "train-0", "trainer", None),
    ]
    assert result.errors == {}


def test_processes_of_a_pod_take_its_name_and_the_pod_keeps_its_uid(kubelet: tuple[Kubelet, str]) -> None:
    server, path = kubelet
    server.pods = [pod("ml", "train-0", ("trainer", "nvidia.com/gpu", [UUIDS[2]]))]
    process = ProcessReading(NODE, 2, UUIDS[2], 4242, 1 << 30, "python", "1000", f"pod/{POD_UID}")
    cgroup_job = GpuJob(NODE, 2, UUIDS[2], f"pod/{POD_UID}", "1000")
    mapped, client = mapper(path)
    try:
        result = mapped.enrich(snapshot((process,), (cgroup_job,)))
    finally:
        client.close()
    assert [p.job_id for p in result.processes] == ["ml/train-0"]
    assert result.jobs == (GpuJob(NODE, 2, UUIDS[2], "ml/train-0", None, None, "ml", "train-0", "trainer", POD_UID),)
    text = render_metrics(result, ExporterHealth(None, None, {}), dcgm_compat=True).decode()
    assert (
        f'gpulens_pod_gpu_info{{node="{NODE}",gpu="2",uuid="{UUIDS[2]}",job_id="ml/train-0",namespace="ml",'
        f'pod="train-0",container="trainer",pod_uid="{POD_UID}",mig_uuid=""}} 1'
    ) in text
    assert 'container="trainer",namespace="ml",pod="train-0"' in text  # dcgm-exporter's labels


def test_mig_time_sliced_and_old_mig_device_ids_find_their_gpu(kubelet: tuple[Kubelet, str]) -> None:
    server, path = kubelet
    server.pods = [
        pod("a", "mig", ("c", "nvidia.com/mig-1g.10gb", [MIG])),
        pod("b", "sliced", ("c", "nvidia.com/gpu", [f"{UUIDS[1]}::3"])),
        pod("c", "old-mig", ("c", "nvidia.com/mig-1g.10gb", [f"MIG-{UUIDS[3]}/5/0"])),
        pod("d", "elsewhere", ("c", "nvidia.com/gpu", ["GPU-not-on-this-node"])),
        pod("e", "by-index", ("c", "nvidia.com/gpu", ["2"])),  # DEVICE_ID_STRATEGY=index
    ]
    mapped, client = mapper(path)
    try:
        result = mapped.enrich(snapshot())
    finally:
        client.close()
    assert [(j.gpu, j.job_id, j.mig_uuid) for j in result.jobs] == [
        (1, "b/sliced", None),
        (2, "e/by-index", None),
        (3, "a/mig", MIG),
        (3, "c/old-mig", MIG),
    ]
    assert result.errors == {UNKNOWN_DEVICE: 1}


def test_allocatable_resources_where_served_and_none_where_not(kubelet: tuple[Kubelet, str]) -> None:
    server, path = kubelet
    client = KubeletClient(path, timeout_s=5.0)
    try:
        assert client.allocatable() is None  # UNIMPLEMENTED: asked once, then never again
        server.allocatable = [api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=UUIDS[:2])]
        assert client.allocatable() is None
        fresh = KubeletClient(path, timeout_s=5.0)
        try:
            assert fresh.allocatable() == {"nvidia.com/gpu": tuple(UUIDS[:2])}
            mapped = PodMapper(fresh, clock=lambda: 0.0)
            mapped.enrich(snapshot())
            assert mapped.allocatable == {"nvidia.com/gpu": tuple(UUIDS[:2])}
        finally:
            fresh.close()
    finally:
        client.close()


def test_a_kubelet_that_does_not_answer_leaves_the_cgroup_jobs_and_is_counted(tmp_path: Path) -> None:
    client = KubeletClient(str(tmp_path / "absent.sock"), timeout_s=0.5)
    cgroup_job = GpuJob(NODE, 0, UUIDS[0], f"pod/{POD_UID}")
    try:
        with pytest.raises(KubeletError, match="UNAVAILABLE"):
            client.list()
        mapped = PodMapper(client, clock=lambda: 0.0)
        before = snapshot(jobs=(cgroup_job,))
        after = mapped.enrich(before)
        mapped.enrich(before)
    finally:
        client.close()
    assert after.jobs == (cgroup_job,)
    assert dataclasses.replace(after, errors={}) == before
    assert mapped.enrich(before).errors == {UNAVAILABLE: 3}


def test_the_exporter_reads_the_socket_only_where_named_or_present(
    kubelet: tuple[Kubelet, str], tmp_path: Path
) -> None:
    server, path = kubelet
    server.pods = [pod("ml", "p", ("c", "nvidia.com/gpu", [UUIDS[0]]))]
    absent = str(tmp_path / "none.sock")
    assert _pod_mapper(ExporterOptions(kubelet_socket=absent)) is None  # the default path, absent: not Kubernetes
    assert _pod_mapper(ExporterOptions(kubelet_socket="", kubelet_socket_given=True)) is None
    pods = _pod_mapper(ExporterOptions(kubelet_socket=path))
    assert pods is not None
    enrich, lister = pods
    try:  # the kubelet is asked on the reader's own thread: its answer arrives, the collection never waits for it
        assert _eventually(lambda: [j.job_id for j in enrich(snapshot()).jobs] == ["ml/p"])
        assert lister.state().stale is False
    finally:
        lister.close()


def test_a_missing_k8s_extra_is_one_line_with_the_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "grpc" else real(name, *a))
    with pytest.raises(MissingExtraError, match=r"pip install 'gpulens\[k8s\]'"):
        require_k8s("--kubelet-socket")
    options = ExporterOptions(kubelet_socket=str(tmp_path / "k.sock"), kubelet_socket_given=True)
    with pytest.raises(ConfigError) as raised:
        _pod_mapper(options)
    assert "\n" not in str(raised.value)
    assert "gpulens[k8s]" in str(raised.value)
