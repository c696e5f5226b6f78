"""A client of the kubelet's pod-resources API (gRPC v1) on its unix socket: ``List`` and
``GetAllocatableResources``, each answer reduced to plain records.

Importing this module needs the ``k8s`` extra (grpcio, protobuf); ``gpulens.extras.require_k8s`` says so in one
line first. A call that fails raises :class:`KubeletError` with a one-line reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import grpc

from gpulens.exporter.podresources import api_pb2, api_pb2_grpc

DEFAULT_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
# A node with many pods answers List with more than gRPC's default 4 MiB; dcgm-exporter allows 16 MiB too. A larger
# answer is refused by gRPC (RESOURCE_EXHAUSTED) before it is parsed.
MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024
# The pods of one answer that are turned into records: a kubelet runs 110 pods by default (--max-pods), a few hundred
# on large nodes; past this the rest are dropped and the answer counted as truncated.
MAX_PODS: Final = 1024


class KubeletError(Exception):
    """The kubelet did not answer a pod-resources call."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """Devices of one resource assigned to one container of one pod."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_ids: tuple[str, ...]


class KubeletClient:
    """Calls the kubelet's ``PodResourcesLister`` at ``socket_path``, each call bounded by ``timeout_s``, each
    answer by ``max_bytes`` (refused beyond) and ``max_pods`` (the rest dropped, counted in ``truncated``)."""

    def __init__(
        self,
        socket_path: str,
        *,
        timeout_s: float = 1.0,
        max_bytes: int = MAX_MESSAGE_BYTES,
        max_pods: int = MAX_PODS,
    ) -> None:
        self._timeout_s = timeout_s
        self._max_pods = max_pods
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}",
            options=[("grpc.max_receive_message_length", max_bytes)],
        )
        self._stub: Any = api_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        self._allocatable_served = True
        self.pods_read = 0  # pods turned into records from the last answer
        self.truncated = 0  # answers with more than max_pods pods

    def list(self) -> list[Assignment]:
        """Every device assignment of the running pods' containers (the first ``max_pods`` pods). Raises
        KubeletError."""
        response = self._call(self._stub.List, api_pb2.ListPodResourcesRequest())
        pods = response.pod_resources
        if len(pods) > self._max_pods:
            self.truncated += 1
            pods = pods[: self._max_pods]
        self.pods_read = len(pods)
        return [
            Assignment(pod.namespace, pod.name, container.name, devices.resource_name, tuple(devices.device_ids))
            for pod in pods
            for container in pod.containers
            for devices in container.devices
        ]

    def allocatable(self) -> dict[str, tuple[str, ...]] | None:
        """Device IDs per resource that the kubelet can allocate (healthy devices), or None where the kubelet does
        not serve ``GetAllocatableResources`` (before 1.21, or the feature gate off). Raises KubeletError."""
        if not self._allocatable_served:
            return None
        try:
            response = self._call(self._stub.GetAllocatableResources, api_pb2.AllocatableResourcesRequest())
        except _UnimplementedError:
            self._allocatable_served = False
            return None
        out: dict[str, list[str]] = {}
        for devices in response.devices:
            out.setdefault(devices.resource_name, []).extend(devices.device_ids)
        return {name: tuple(ids) for name, ids in out.items()}

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise _UnimplementedError from None
            name = code.name if code is not None else "error"
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise KubeletError(f"kubelet pod-resources: {name}: {details}") from None

    def close(self) -> None:
        self._channel.close()


class _UnimplementedError(KubeletError):
    """The kubelet does not serve this method."""
