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
# A node with many pods answers List with more than gRPC's default 4 MiB; dcgm-exporter allows 16 MiB too.
MAX_MESSAGE_BYTES: Final = 16 * 1024 * 1024


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
    """Calls the kubelet's ``PodResourcesLister`` at ``socket_path``, each call bounded by ``timeout_s``."""

    def __init__(self, socket_path: str, *, timeout_s: float = 1.0) -> None:
        self._timeout_s = timeout_s
        self._channel = grpc.insecure_channel(
            f"unix://{socket_path}",
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
        )
        self._stub: Any = api_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        self._allocatable_served = True

    def list(self) -> list[Assignment]:
        """Every device assignment of every running pod's containers. Raises KubeletError."""
        response = self._call(self._stub.List, api_pb2.ListPodResourcesRequest())
        return [
            Assignment(pod.namespace, pod.name, container.name, devices.resource_name, tuple(devices.device_ids))
            for pod in response.pod_resources
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
