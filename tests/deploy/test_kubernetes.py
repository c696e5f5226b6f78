"""The Kubernetes manifest: a DaemonSet on GPU nodes that sees the host's processes and serves the CLI's port."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

import gpulens
from tests.deploy.support import DEPLOY, DOCKERFILE, default_port, parse_with_env, unknown_twins

MANIFEST = DEPLOY / "kubernetes" / "gpulens-exporter.yaml"


@pytest.fixture(scope="module")
def objects() -> dict[str, dict[str, Any]]:
    docs = [doc for doc in yaml.safe_load_all(MANIFEST.read_text()) if doc]
    by_kind = {doc["kind"]: doc for doc in docs}
    assert len(by_kind) == len(docs), "one object of each kind"
    return by_kind


def pod_spec(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = objects["DaemonSet"]["spec"]["template"]["spec"]
    return spec


def container(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    (only,) = pod_spec(objects)["containers"]
    spec: dict[str, Any] = only
    return spec


def test_manifest_holds_the_expected_objects_in_one_namespace(objects: dict[str, dict[str, Any]]) -> None:
    assert set(objects) == {"Namespace", "ServiceAccount", "DaemonSet", "Service"}
    namespace = objects["Namespace"]["metadata"]["name"]
    for kind in ("ServiceAccount", "DaemonSet", "Service"):
        assert objects[kind]["metadata"]["namespace"] == namespace, kind
    assert pod_spec(objects)["serviceAccountName"] == objects["ServiceAccount"]["metadata"]["name"]
    assert objects["DaemonSet"]["apiVersion"] == "apps/v1"


def test_pods_see_the_host_processes_through_a_read_only_proc(
    objects: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = pod_spec(objects)
    assert spec["hostPID"] is True
    env = {e["name"]: e["value"] for e in container(objects)["env"] if "value" in e}
    args = parse_with_env(container(objects)["args"], env, monkeypatch)
    mounts = {m["name"]: m for m in container(objects)["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    (proc,) = [name for name, v in volumes.items() if v.get("hostPath", {}).get("path") == "/proc"]
    assert mounts[proc]["mountPath"] == args.proc_root
    assert mounts[proc]["readOnly"] is True


def test_pods_read_the_kubelets_pod_resources_socket(
    objects: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = pod_spec(objects)
    env = {e["name"]: e["value"] for e in container(objects)["env"] if "value" in e}
    args = parse_with_env(container(objects)["args"], env, monkeypatch)
    mounts = {m["name"]: m for m in container(objects)["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    directory = "/var/lib/kubelet/pod-resources"
    (name,) = [n for n, v in volumes.items() if v.get("hostPath", {}).get("path") == directory]
    assert args.kubelet_socket == f"{mounts[name]['mountPath']}/kubelet.sock"
    assert mounts[name]["readOnly"] is True


def test_xid_occurrences_outlive_the_pod_in_a_host_directory(
    objects: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The XID ledger's state directory is the host's, so escalation across restarts and reboots holds."""
    spec = pod_spec(objects)
    env = {e["name"]: e["value"] for e in container(objects)["env"] if "value" in e}
    args = parse_with_env(container(objects)["args"], env, monkeypatch)
    mounts = {m["name"]: m for m in container(objects)["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    (name,) = [n for n, v in volumes.items() if v.get("hostPath", {}).get("path") == "/var/lib/gpulens/exporter"]
    assert mounts[name]["mountPath"] == args.state_dir
    assert not mounts[name].get("readOnly", False)


def test_container_uses_real_flags_and_the_default_port(
    objects: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    c = container(objects)
    names = {e["name"] for e in c["env"]}
    assert not unknown_twins("exporter", dict.fromkeys(names, ""))
    env = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    args = parse_with_env(c["args"], env, monkeypatch)
    port = default_port("exporter")
    assert args.listen == f"0.0.0.0:{port}"
    (metrics,) = c["ports"]
    assert metrics["containerPort"] == port
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": metrics["name"]}
    node = next(e for e in c["env"] if e["name"] == "GPULENS_EXPORTER_NODE")
    assert node["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    annotations = objects["DaemonSet"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)
    assert annotations["prometheus.io/path"] == "/metrics"


def test_runs_unprivileged_as_the_image_user(objects: dict[str, dict[str, Any]]) -> None:
    security = pod_spec(objects)["securityContext"]
    user = next(line.split()[1] for line in DOCKERFILE.read_text().splitlines() if line.startswith("USER "))
    assert f"{security['runAsUser']}:{security['runAsGroup']}" == user
    assert security["runAsNonRoot"] is True
    c = container(objects)["securityContext"]
    assert c["allowPrivilegeEscalation"] is False
    assert c["readOnlyRootFilesystem"] is True
    assert c["capabilities"]["drop"] == ["ALL"]
    assert container(objects)["image"] == f"gpulens:{gpulens.__version__}"


def test_schedules_on_gpu_nodes_without_taking_their_gpus(objects: dict[str, dict[str, Any]]) -> None:
    spec = pod_spec(objects)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    resources = container(objects)["resources"]
    for kind in ("requests", "limits"):
        assert "nvidia.com/gpu" not in resources.get(kind, {})
    env = {e["name"]: e.get("value") for e in container(objects)["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_service_selects_the_daemonset_pods(objects: dict[str, dict[str, Any]]) -> None:
    service = objects["Service"]["spec"]
    labels = objects["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    assert objects["DaemonSet"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (port,) = service["ports"]
    assert port["targetPort"] == container(objects)["ports"][0]["name"]
    assert port["port"] == default_port("exporter")
    assert service["clusterIP"] == "None"
