"""Pod mapping: which Kubernetes pod and container hold each GPU, from the kubelet's pod-resources API.

The kubelet names, for every container of every running pod, the device IDs the device plugin gave it: a GPU UUID
(``nvidia.com/gpu``; its index with the plugin's ``DEVICE_ID_STRATEGY=index``), a MIG UUID
(``nvidia.com/mig-<profile>``, or ``MIG-<GPU UUID>/<gi>/<ci>`` from drivers before R470), with a ``::<n>`` suffix
where a GPU is time-sliced. Each becomes a job ``<namespace>/<pod>`` on its GPU with namespace, pod and container; a
GPU allocated to a pod is held even before any process runs on it. A process whose cgroup says ``pod/<uid>`` on a GPU
that one pod holds takes that pod's name, and the pod keeps its UID (the API does not carry it).

The mapper runs after the cgroup job mapper. It never reads processes' environments. A kubelet that does not answer
is counted (``podresources_unavailable``), logged once, and the snapshot passes on as the cgroups left it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Final, Protocol

from gpulens.logutil import ErrorCounter
from gpulens.model import GpuJob, NodeSnapshot, ProcessReading

logger = logging.getLogger(__name__)

UNAVAILABLE: Final = "podresources_unavailable"
UNKNOWN_DEVICE: Final = "podresources_unknown_device"
GPU_RESOURCE_PREFIX: Final = "nvidia.com/"
ALLOCATABLE_REFRESH_S: Final = 300.0
_OLD_MIG: Final = re.compile(r"MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)")


class Assignment(Protocol):
    @property
    def namespace(self) -> str: ...
    @property
    def pod(self) -> str: ...
    @property
    def container(self) -> str: ...
    @property
    def resource_name(self) -> str: ...
    @property
    def device_ids(self) -> tuple[str, ...]: ...


class Lister(Protocol):
    """What the mapper needs of the kubelet (``client.KubeletClient``); both methods raise on failure."""

    def list(self) -> Iterable[Assignment]: ...

    def allocatable(self) -> Mapping[str, tuple[str, ...]] | None: ...


class PodMapper:
    """Adds the pods that hold each GPU to a snapshot's jobs, and names the processes of those pods.

    ``clock`` (monotonic seconds) paces the refresh of the allocatable devices, read every ``ALLOCATABLE_REFRESH_S``.
    """

    def __init__(self, lister: Lister, *, clock: Callable[[], float]) -> None:
        self._lister = lister
        self._clock = clock
        self._errors = ErrorCounter(logger)
        self._allocatable: Mapping[str, tuple[str, ...]] | None = None
        self._allocatable_at: float | None = None

    @property
    def allocatable(self) -> Mapping[str, tuple[str, ...]] | None:
        """Device IDs per GPU resource that the kubelet can allocate, when it serves GetAllocatableResources."""
        return self._allocatable

    def enrich(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        try:
            assignments = list(self._lister.list())
            self._refresh_allocatable()
        except Exception as exc:  # noqa: BLE001 - any failure of the kubelet leaves the cgroup jobs as they are
            self._errors.count(UNAVAILABLE, "cannot read the kubelet's pod-resources API: %s", exc)
            return snapshot.replace(errors={**snapshot.errors, **self._errors.snapshot()})
        pod_jobs = self._pod_jobs(snapshot, assignments)
        processes, uids = _named_processes(snapshot.processes, pod_jobs)
        pod_jobs = [dataclasses.replace(j, pod_uid=uids.get(j.job_id)) for j in pod_jobs]
        renamed = {f"pod/{uid}" for uid in uids.values()}
        jobs = [j for j in snapshot.jobs if j.job_id not in renamed]
        pod_names = {j.job_id for j in pod_jobs}
        for p in processes:  # the jobs of processes named here that the pods do not already list
            if p.job_id is None or p.job_id in pod_names:
                continue
            if not any(j.uuid == p.uuid and j.job_id == p.job_id for j in jobs):
                jobs.append(GpuJob(node=p.node, gpu=p.gpu, uuid=p.uuid, job_id=p.job_id, user=p.user))
        merged = {(j.uuid, j.mig_uuid, j.job_id): j for j in jobs}
        for job in pod_jobs:  # the kubelet's record wins: it has the pod's names
            known = merged.get((job.uuid, job.mig_uuid, job.job_id))
            merged[(job.uuid, job.mig_uuid, job.job_id)] = job if known is None else _with_pod(known, job)
        ordered = sorted(merged.values(), key=lambda j: (j.node, j.gpu, j.uuid, j.job_id, j.mig_uuid or ""))
        errors = {**snapshot.errors, **self._errors.snapshot()}
        return snapshot.replace(processes=tuple(processes), jobs=tuple(ordered), errors=errors)

    def _refresh_allocatable(self) -> None:
        now = self._clock()
        if self._allocatable_at is not None and now - self._allocatable_at < ALLOCATABLE_REFRESH_S:
            return
        self._allocatable_at = now
        served = self._lister.allocatable()
        if served is not None:
            served = {name: ids for name, ids in served.items() if name.startswith(GPU_RESOURCE_PREFIX)}
            logger.debug("kubelet: %d allocatable GPU devices", sum(map(len, served.values())))
        self._allocatable = served

    def _pod_jobs(self, snapshot: NodeSnapshot, assignments: Iterable[Assignment]) -> list[GpuJob]:
        gpus = {g.uuid: g.gpu for g in snapshot.gpus}
        by_index = {str(g.gpu): g.uuid for g in snapshot.gpus}  # the device plugin's DEVICE_ID_STRATEGY=index
        migs = {m.mig_uuid: m for m in snapshot.migs}
        migs_by_instance = {(m.uuid, m.gpu_instance_id): m for m in snapshot.migs}
        out: list[GpuJob] = []
        for a in assignments:
            if not a.resource_name.startswith(GPU_RESOURCE_PREFIX):
                continue
            for device in a.device_ids:
                device_id = device.split("::", 1)[0]  # time-slicing: GPU-<uuid>::<replica>
                uuid, mig_uuid = by_index.get(device_id, device_id), None
                if device_id in migs:
                    uuid, mig_uuid = migs[device_id].uuid, device_id
                elif match := _OLD_MIG.fullmatch(device_id):
                    uuid = match.group(1)
                    known = migs_by_instance.get((uuid, int(match.group(2))))
                    mig_uuid = known.mig_uuid if known is not None else device_id
                if uuid not in gpus:
                    self._errors.count(
                        UNKNOWN_DEVICE, "the kubelet names device %s, which no GPU of this node matches", device_id
                    )
                    continue
                out.append(
                    GpuJob(
                        node=snapshot.node,
                        gpu=gpus[uuid],
                        uuid=uuid,
                        job_id=f"{a.namespace}/{a.pod}",
                        mig_uuid=mig_uuid,
                        namespace=a.namespace,
                        pod=a.pod,
                        container=a.container,
                    )
                )
        return out


def _named_processes(
    processes: Iterable[ProcessReading], pod_jobs: Iterable[GpuJob]
) -> tuple[list[ProcessReading], dict[str, str]]:
    """Processes of ``pod/<uid>`` on a GPU that one pod holds, named ``<namespace>/<pod>``; and each pod's UID."""
    pods_by_gpu: dict[str, set[str]] = {}
    for job in pod_jobs:
        pods_by_gpu.setdefault(job.uuid, set()).add(job.job_id)
    uids: dict[str, str] = {}
    out: list[ProcessReading] = []
    for p in processes:
        pods = pods_by_gpu.get(p.uuid, set())
        if p.job_id is not None and p.job_id.startswith("pod/") and len(pods) == 1:
            (name,) = pods
            uids.setdefault(name, p.job_id.removeprefix("pod/"))
            p = dataclasses.replace(p, job_id=name)
        out.append(p)
    return out, uids


def _with_pod(known: GpuJob, pod: GpuJob) -> GpuJob:
    return dataclasses.replace(
        known, namespace=pod.namespace, pod=pod.pod, container=pod.container, pod_uid=known.pod_uid or pod.pod_uid
    )
