"""The optional parts of the installation: which extra brings which component's libraries.

``pip install gpulens`` installs the node agent (``gpulens exporter``) and the core. The collector, storage, alerts
and dashboard need the ``server`` extra; reading the kubelet's pod-resources API (the exporter on a Kubernetes node)
needs the ``k8s`` extra (gRPC). Each of those packages calls :func:`require_server` first, so a node that
lacks the libraries is told in one line what to install rather than shown a missing-module traceback.
"""

from __future__ import annotations

import importlib.util
from typing import Final

SERVER_HINT: Final = "pip install 'gpulens[server]'"
K8S_HINT: Final = "pip install 'gpulens[k8s]'"


class MissingExtraError(ModuleNotFoundError):
    """A component was imported without the libraries of its extra."""


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # an import hook that refuses the name
        return False


def require_server(component: str, *modules: str) -> None:
    """Raise :class:`MissingExtraError` naming ``component`` if any of ``modules`` cannot be imported."""
    missing = [name for name in modules if not _importable(name)]
    if missing:
        raise MissingExtraError(
            f"{component} needs {', '.join(missing)}, which the server extra installs: {SERVER_HINT}",
            name=missing[0],
        )


def require_k8s(component: str) -> None:
    """Raise :class:`MissingExtraError` if gRPC and protobuf, which the k8s extra installs, cannot be imported."""
    missing = [name for name in ("grpc", "google.protobuf") if _missing(name)]
    if missing:
        raise MissingExtraError(
            f"{component} needs {', '.join(missing)}, which the k8s extra installs: {K8S_HINT}", name=missing[0]
        )


def _missing(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except ModuleNotFoundError:  # the parent package (google) is absent
        return True
