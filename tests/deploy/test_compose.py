"""docker-compose.yml, the Dockerfile and the stack's gpulens.toml: valid, and in agreement with the code.

No Docker engine runs here; Debian's docker-compose validates and resolves the file offline (`config`), and the
resolved services are compared with the CLI's real flags and defaults and the config schema.
"""

from __future__ import annotations

import ast
import fnmatch
import re
import stat
import subprocess
import tomllib
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from gpulens.exporter.sim import SimCluster, load_scenario
from gpulens.settings import CollectorFile, load_settings
from tests.conftest import require_tool
from tests.deploy.support import (
    COMPOSE_FILE,
    DEPLOY,
    PROFILES,
    ROOT,
    TOML,
    clean_env,
    default_port,
    docker_compose,
    dockerfile_instructions,
    gpulens_command,
    image_path_in_repo,
    parse_with_env,
    port_of,
    resolved_compose,
    service_env,
    unknown_twins,
)

GPULENS_IMAGE = re.compile(r"^gpulens:")
SECRETS_SCRIPT = DEPLOY / "make-secrets.sh"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return resolved_compose(*PROFILES)


def gpulens_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose["services"].items() if GPULENS_IMAGE.match(svc.get("image", ""))}


def container_ports(service: dict[str, Any]) -> set[int]:
    """Container ports of a service's ``ports``: ``[host_ip:]host:container[/proto]`` or ``{target: ...}``."""
    ports = set()
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            ports.add(int(entry["target"]))
        else:
            ports.add(int(str(entry).split("/")[0].rpartition(":")[2]))
    return ports


# --- the file is valid ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "profiles",
    [(), ("gpu",), ("sim",), ("gpu", "dcgm"), ("sim", "prom-read")],
    ids=["default", "gpu", "sim", "dcgm", "prom-read"],
)
def test_docker_compose_config_accepts_the_file(profiles: tuple[str, ...]) -> None:
    args = [arg for profile in profiles for arg in ("--profile", profile)]
    result = docker_compose(*args, "config", "--quiet")
    assert result.returncode == 0, result.stderr


def test_docker_compose_rejects_a_broken_copy(tmp_path: Path) -> None:
    """The validation is real: the same file with one misspelt key fails."""
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace("    pid: host\n", "    pid_namespace: host\n", 1))
    result = docker_compose("config", "--quiet", compose_file=broken)
    assert result.returncode != 0
    assert "pid_namespace" in result.stderr


def test_profiles_split_the_gpu_stack_from_the_simulated_one(compose: dict[str, Any]) -> None:
    profiles = {name: set(svc.get("profiles", [])) for name, svc in compose["services"].items()}
    always = {name for name, p in profiles.items() if not p}
    assert always == {"postgres", "dashboard"}
    assert {name for name, p in profiles.items() if "gpu" in p} == {"exporter", "collector", "prometheus"}
    assert {name for name, p in profiles.items() if "sim" in p} == {"exporter-sim", "collector-sim", "prometheus-sim"}
    assert {name for name, p in profiles.items() if "dcgm" in p} == {"dcgm-exporter"}
    assert {name for name, p in profiles.items() if "prom-read" in p} == {
        "dashboard-prom",
        "alerts-prom",
        "alertmanager",
    }


# --- services agree with the code -----------------------------------------------------------------------------------


def test_gpulens_services_use_real_commands_flags_and_env_twins(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = gpulens_services(compose)
    assert set(services) == {
        "exporter", "exporter-sim", "collector", "collector-sim", "dashboard", "dashboard-prom", "alerts-prom"
    }  # fmt: skip
    for name, svc in services.items():
        command = svc["command"]
        env = service_env(svc)
        assert not unknown_twins(command[0], env), (
            f"{name}: environment names no flag: {unknown_twins(command[0], env)}"
        )
        args = parse_with_env(command, env, monkeypatch)  # argparse errors fail the test
        assert args.command == command[0], name


def test_listen_addresses_and_published_ports_match_the_code_defaults(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    services = compose["services"]
    for name in ("exporter", "exporter-sim", "dashboard", "dashboard-prom"):
        command = services[name]["command"]
        args = parse_with_env(command, service_env(services[name]), monkeypatch)
        host, _, port = args.listen.rpartition(":")
        assert host == "0.0.0.0", f"{name} must listen on every interface inside its container"
        assert int(port) == default_port(command[0]), name
        assert container_ports(services[name]) == {int(port)}, name
    # the collector's address comes from the config file; Prometheus scrapes it over the compose network
    settings = load_settings(TOML, environ={"GPULENS_DB_URL": "sqlite:///unused.db"})
    schema_default = CollectorFile().listen
    assert settings.listen == f"0.0.0.0:{port_of(schema_default)}"


def test_healthchecks_probe_the_port_each_service_listens_on(compose: dict[str, Any]) -> None:
    collector_port = port_of(load_settings(TOML, environ={"GPULENS_DB_URL": "sqlite://"}).listen)
    expected = {
        "exporter": f"127.0.0.1:{default_port('exporter')}/healthz",
        "exporter-sim": f"127.0.0.1:{default_port('exporter')}/healthz",
        "collector": f"127.0.0.1:{collector_port}/metrics",
        "collector-sim": f"127.0.0.1:{collector_port}/metrics",
        "dashboard": f"127.0.0.1:{default_port('dashboard')}/healthz",
        "dashboard-prom": f"127.0.0.1:{default_port('dashboard')}/healthz",
    }
    for name, where in expected.items():
        probe = " ".join(compose["services"][name]["healthcheck"]["test"])
        assert f"http://{where}" in probe, name


def test_the_gpu_exporter_sees_the_host(compose: dict[str, Any]) -> None:
    exporter = compose["services"]["exporter"]
    assert exporter["pid"] == "host"
    env = service_env(exporter)
    proc_root = env["GPULENS_EXPORTER_PROC_ROOT"]
    assert f"/proc:{proc_root}:ro" in exporter["volumes"]
    devices = exporter["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert exporter["read_only"] is True
    assert exporter["cap_drop"] == ["ALL"]


def test_dcgm_profile_feeds_the_exporter(compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    services = compose["services"]
    dcgm_port = next(iter(container_ports(services["dcgm-exporter"])))
    assert service_env(services["exporter"])["GPULENS_EXPORTER_DCGM_URL"] == f"http://dcgm-exporter:{dcgm_port}/metrics"
    # the documented switch: GPULENS_EXPORTER_SOURCE=dcgm docker compose --profile gpu --profile dcgm up
    switched = resolved_compose("gpu", "dcgm", env=clean_env(GPULENS_EXPORTER_SOURCE="dcgm"))["services"]["exporter"]
    args = parse_with_env(switched["command"], service_env(switched), monkeypatch)
    assert args.source == "dcgm"


def test_sim_profile_serves_the_demo_scenario_and_collects_every_node(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    sim = compose["services"]["exporter-sim"]
    args = parse_with_env(sim["command"], service_env(sim), monkeypatch)
    assert (args.source, args.all_nodes) == ("sim", True)
    nodes = SimCluster(load_scenario(image_path_in_repo(args.scenario))).node_names()
    port = port_of(args.listen)
    targets = service_env(compose["services"]["collector-sim"])["GPULENS_COLLECTOR_TARGET"].split(",")
    assert targets == [f"http://exporter-sim:{port}/node/{node}" for node in nodes]
    assert service_env(compose["services"]["collector"])["GPULENS_COLLECTOR_TARGET"] == (
        f"http://exporter:{default_port('exporter')}"
    )


def test_prom_read_profile_reads_the_bundled_prometheus(compose: dict[str, Any]) -> None:
    from gpulens.storage.connect import is_prometheus_url

    services = compose["services"]
    prometheus_port = next(iter(container_ports(services["prometheus-sim"])))
    for name in ("dashboard-prom", "alerts-prom"):
        svc = services[name]
        env = service_env(svc)
        assert env["GPULENS_DB_URL"] == f"prometheus+http://prometheus-sim:{prometheus_port}", name
        mounts: dict[str, str] = {}
        for volume in svc["volumes"]:
            source, target = str(volume).split(":")[:2]
            mounts[target] = source  # container path -> host path or volume name
        config = Path(mounts[svc["command"][svc["command"].index("--config") + 1]])
        settings = load_settings(config, environ=env)
        assert is_prometheus_url(settings.db_url), name
        state = Path(settings.state_url.removeprefix("sqlite:///")).parent
        assert mounts[str(state)] == "prom-alert-state", name  # a volume both services share
    assert "prom-alert-state" in compose["volumes"]


def test_prom_read_profile_sends_the_alerts_to_its_alertmanager(compose: dict[str, Any]) -> None:
    from gpulens.alerts.service import alerting_config

    services = compose["services"]
    alertmanager = services["alertmanager"]
    port = next(iter(container_ports(alertmanager)))
    env = service_env(services["alerts-prom"])
    assert env["GPULENS_ALERTMANAGER_URL"] == f"http://alertmanager:{port}"
    receivers = alerting_config(load_settings(ROOT / "deploy" / "config" / "gpulens-prometheus.toml", environ=env))
    [receiver] = receivers.receivers
    assert (receiver.kind, receiver.url_env) == ("alertmanager", ("GPULENS_ALERTMANAGER_URL",))
    config = next(str(v).split(":")[0] for v in alertmanager["volumes"] if str(v).endswith("alertmanager.yml:ro"))
    checked = subprocess.run(
        [require_tool("amtool"), "check-config", config], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "2 inhibit rules" in checked.stdout


# --- secrets ----------------------------------------------------------------------------------------------------------


def test_database_password_only_travels_as_secret_files(compose: dict[str, Any]) -> None:
    url_file = tomllib.loads(TOML.read_text())["database"]["url_file"]
    secret = re.fullmatch(r"/run/secrets/([\w-]+)", url_file)
    assert secret, url_file
    for name, svc in gpulens_services(compose).items():
        if service_env(svc).get("GPULENS_DB_URL", "").startswith("prometheus+"):
            assert "secrets" not in svc, name  # it reads Prometheus: no database password to carry
        elif "collector" in svc["command"] or "dashboard" in svc["command"]:
            assert {"source": secret.group(1)} in svc["secrets"], name
    postgres = compose["services"]["postgres"]
    password_file = postgres["environment"]["POSTGRES_PASSWORD_FILE"]
    assert {"source": password_file.rpartition("/")[2]} in postgres["secrets"]
    for name in compose["secrets"]:
        assert Path(compose["secrets"][name]["file"]).parent == DEPLOY / "secrets"
    credentials_in_url = re.compile(r"://[^/\s:@]+:[^/\s@]+@")
    assert not credentials_in_url.search(COMPOSE_FILE.read_text())
    assert not credentials_in_url.search(TOML.read_text())


def test_make_secrets_writes_a_password_and_the_url_that_carries_it(compose: dict[str, Any], tmp_path: Path) -> None:
    target = tmp_path / "secrets"
    first = subprocess.run(["bash", str(SECRETS_SCRIPT), str(target)], capture_output=True, text=True, check=False)
    assert first.returncode == 0, first.stderr
    password = (target / "postgres-password").read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{48}", password)
    url = urllib.parse.urlsplit((target / "gpulens-db-url").read_text().strip())
    postgres = compose["services"]["postgres"]["environment"]
    assert url.scheme == "postgresql+psycopg"
    assert (url.username, url.password) == (postgres["POSTGRES_USER"], password)
    assert (url.hostname, url.port) == ("postgres", 5432)
    assert url.path == f"/{postgres['POSTGRES_DB']}"
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    assert stat.S_IMODE((target / "postgres-password").stat().st_mode) == 0o644
    # a second run keeps the secrets; a half-present pair is refused
    again = subprocess.run(["bash", str(SECRETS_SCRIPT), str(target)], capture_output=True, text=True, check=False)
    assert again.returncode == 0
    assert (target / "postgres-password").read_text().strip() == password
    (target / "gpulens-db-url").unlink()
    half = subprocess.run(["bash", str(SECRETS_SCRIPT), str(target)], capture_output=True, text=True, check=False)
    assert half.returncode == 1
    assert "only one" in half.stderr


# --- gpulens.toml -----------------------------------------------------------------------------------------------------


def check_config(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*gpulens_command(), "check-config", str(path)],
        capture_output=True,
        text=True,
        env=clean_env(**env),
        timeout=60,
        check=False,
    )


def test_stack_config_passes_check_config() -> None:
    result = check_config(TOML, GPULENS_DB_URL="postgresql+psycopg://gpulens@postgres:5432/gpulens")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{TOML}: OK")


def test_stack_config_reads_the_url_that_make_secrets_writes(tmp_path: Path) -> None:
    subprocess.run(["bash", str(SECRETS_SCRIPT), str(tmp_path / "s")], capture_output=True, check=True)
    password = (tmp_path / "s" / "postgres-password").read_text().strip()
    url_file = tomllib.loads(TOML.read_text())["database"]["url_file"]
    copy = tmp_path / "gpulens.toml"
    copy.write_text(TOML.read_text().replace(url_file, str(tmp_path / "s" / "gpulens-db-url")))
    result = check_config(copy)
    assert result.returncode == 0, result.stderr
    assert re.search(r"database postgresql\+psycopg://\S*\*\*\*@postgres:5432/gpulens\)$", result.stdout.strip())
    assert password not in result.stdout + result.stderr
    # without the secret the loader names the key and the file
    missing = check_config(TOML)
    assert missing.returncode == 1
    assert "database.url_file" in missing.stderr


# --- the image --------------------------------------------------------------------------------------------------------


def test_dockerfile_builds_a_wheel_then_runs_as_an_unprivileged_user() -> None:
    instructions = dockerfile_instructions()
    stages = [rest for instruction, rest in instructions if instruction == "FROM"]
    assert len(stages) == 2
    assert stages[0].endswith(" AS build")
    base = next(rest for instruction, rest in instructions if instruction == "ARG" and rest.startswith("PYTHON_IMAGE="))
    assert base.partition("=")[2].startswith("python:3.11-slim")
    build = instructions[: [i for i, (ins, _) in enumerate(instructions) if ins == "FROM"][1]]
    assert any(ins == "RUN" and "pip wheel" in rest for ins, rest in build)
    runtime = instructions[len(build) :]
    assert ("COPY", "--from=build /opt/gpulens /opt/gpulens") in runtime
    user = [rest for ins, rest in runtime if ins == "USER"]
    assert len(user) == 1
    uid, _, gid = user[0].partition(":")
    assert int(uid) >= 1000
    assert int(gid) >= 1000
    assert ("ENTRYPOINT", '["gpulens"]') in runtime
    for port in (default_port("exporter"), 9411, default_port("dashboard")):
        assert any(ins == "EXPOSE" and str(port) in rest.split() for ins, rest in runtime), port


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker's build context leaves out ``path`` (top-level patterns and ``**/`` patterns)."""
    parts = path.split("/")
    for pattern in patterns:
        bare = pattern.removeprefix("**/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        candidates = parts if pattern.startswith("**/") else prefixes
        if any(fnmatch.fnmatchcase(candidate, bare) for candidate in candidates):
            return True
    return False


def test_dockerignore_keeps_what_the_build_needs_and_drops_secrets() -> None:
    patterns = [
        line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip() and line[0] != "#"
    ]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    # setup.py lists the packages: gpulens and the components' top-level folders mapped into it
    components = ast.literal_eval(re.search(r"COMPONENTS = (\(.*?\))", (ROOT / "setup.py").read_text()).group(1))
    packages = ["gpulens", *components]
    # examples/scenarios/demo.toml is a link into the package; the Dockerfile copies the file it points to.
    needed = [
        "pyproject.toml",
        "setup.py",
        pyproject["project"]["readme"],
        "gpulens/scenarios/demo.toml",
        "examples/scenarios/stall.toml",
    ]
    needed += [f"{package}/__init__.py" for package in packages]
    for path in needed:
        assert not dockerignored(path, patterns), path
    for path in (
        "deploy/secrets/postgres-password",
        ".venv/bin/python",
        ".git/config",
        "tests/conftest.py",
        "x.db",
        "examples/scenarios/demo.toml",
    ):
        assert dockerignored(path, patterns), path
