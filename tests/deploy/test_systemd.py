"""The systemd units (exporter, collector, dashboard): systemd accepts them, they start the CLI with real flags and
variables, they are hardened, and the user the collector and dashboard run as is created by systemd-sysusers."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_tool
from tests.deploy.support import DEPLOY, parse_with_env, unknown_twins

SYSTEMD = DEPLOY / "systemd"
UNIT = SYSTEMD / "gpulens-exporter.service"
DROP_IN = SYSTEMD / "gpulens-exporter.service.d" / "slurm.conf"
TMPFILES = SYSTEMD / "gpustat.tmpfiles.conf"
COLLECTOR = SYSTEMD / "gpulens-collector.service"
DASHBOARD = SYSTEMD / "gpulens-dashboard.service"
SYSUSERS = SYSTEMD / "gpulens.sysusers.conf"
# Each unit and the folder of its drop-ins (verified with it).
UNITS = {"exporter": (UNIT, DROP_IN.parent), "collector": (COLLECTOR, None), "dashboard": (DASHBOARD, None)}
INSTALLED_BINARY = "/opt/gpulens/bin/gpulens"


def unit_entries(*paths: Path) -> dict[str, list[str]]:
    """``{Section.Key: [values...]}`` over the unit and its drop-ins (systemd keys repeat, so values are lists)."""
    entries: dict[str, list[str]] = {}
    for path in paths:
        section = None
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("["):
                section = line.strip("[]")
                continue
            key, _, value = line.partition("=")
            entries.setdefault(f"{section}.{key}", []).append(value)
    return entries


@pytest.mark.parametrize("name", UNITS)
def test_systemd_analyze_verify_accepts_the_unit_and_drop_ins(tmp_path: Path, name: str) -> None:
    analyze = require_tool("systemd-analyze")
    source, drop_ins = UNITS[name]
    # verify checks that ExecStart's binary exists: point it at this checkout's gpulens, change nothing else
    local_binary = Path(sys.executable).parent / "gpulens"
    assert local_binary.exists()
    text = source.read_text()
    assert f"ExecStart={INSTALLED_BINARY} {name}" in text
    unit = tmp_path / source.name
    unit.write_text(text.replace(f"ExecStart={INSTALLED_BINARY} ", f"ExecStart={local_binary} "))
    if drop_ins is not None:
        shutil.copytree(drop_ins, tmp_path / drop_ins.name)
    result = subprocess.run(
        [analyze, "verify", "--man=no", f"./{unit.name}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # verify exits 0 even on unknown keys and bad values; every complaint names the file
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if str(tmp_path) in line]
    assert result.returncode == 0, result.stderr
    assert complaints == []


def test_systemd_analyze_verify_catches_a_bad_key(tmp_path: Path) -> None:
    """The check above is real: a misspelt hardening key is reported."""
    analyze = require_tool("systemd-analyze")
    unit = tmp_path / "bad.service"
    unit.write_text("[Service]\nExecStart=/bin/true\nProtectSystm=strict\n")
    result = subprocess.run(
        [analyze, "verify", "--man=no", f"./{unit.name}"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert "ProtectSystm" in result.stdout + result.stderr


def test_exec_start_and_environment_use_real_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = unit_entries(UNIT, DROP_IN)
    (exec_start,) = entries["Service.ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[0] == INSTALLED_BINARY
    environment = dict(item.split("=", 1) for value in entries["Service.Environment"] for item in shlex.split(value))
    assert not unknown_twins("exporter", environment)
    args = parse_with_env(argv[1:], environment, monkeypatch)
    assert args.command == "exporter"
    assert args.job_map_dir == "/run/gpustat"  # from the Slurm drop-in
    assert entries["Service.EnvironmentFile"] == ["-/etc/gpulens/exporter.env"]


def test_unit_is_hardened() -> None:
    entries = unit_entries(UNIT)
    single = {key: values[-1] for key, values in entries.items()}
    expected = {
        "Service.DynamicUser": "yes",
        "Service.NoNewPrivileges": "yes",
        "Service.ProtectSystem": "strict",
        "Service.ProtectHome": "yes",
        "Service.CapabilityBoundingSet": "CAP_SYSLOG",  # the one capability: /dev/kmsg under dmesg_restrict
        "Service.AmbientCapabilities": "CAP_SYSLOG",
        "Service.StateDirectory": "gpulens/exporter",  # the default --state-dir: XID occurrences per GPU
        "Service.ProtectKernelTunables": "yes",
        "Service.ProtectKernelModules": "yes",
        "Service.ProtectControlGroups": "yes",
        "Service.RestrictNamespaces": "yes",
        "Service.SystemCallArchitectures": "native",
        # its share of CPU on a node whose data loaders saturate every core (docs/exporter.md)
        "Service.CPUWeight": "500",
        "Service.Nice": "-5",
    }
    assert {key: single.get(key) for key in expected} == expected
    # settings that would break the exporter: NVML needs /dev/nvidia*, job mapping needs other processes' /proc,
    # the XID reader /dev/kmsg
    for key in (
        "Service.PrivateDevices",
        "Service.ProtectProc",
        "Service.ProcSubset",
        "Service.DevicePolicy",
        "Service.ProtectKernelLogs",
    ):
        assert key not in entries, key


def test_slurm_pieces_agree_on_the_job_map_directory(tmp_path: Path) -> None:
    tmpfiles = require_tool("systemd-tmpfiles")
    entries = unit_entries(DROP_IN)
    (setting,) = entries["Service.Environment"]
    directory = setting.partition("=")[2]
    prolog_default = re.search(r"dir=\$\{GPUSTAT_DIR:-([^}]+)\}", (DEPLOY / "slurm" / "prolog.sh").read_text())
    assert prolog_default
    assert prolog_default.group(1) == directory
    config = tmp_path / "gpustat.conf"
    config.write_text(TMPFILES.read_text())
    result = subprocess.run(
        [tmpfiles, f"--root={tmp_path}", "--create", str(config)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    created = tmp_path / directory.lstrip("/")
    assert created.is_dir()
    assert oct(created.stat().st_mode & 0o777) == "0o755"


# --- the collector and the dashboard ------------------------------------------------------------------------------


def test_the_collector_starts_with_its_config_and_spool_in_its_state_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    entries = unit_entries(COLLECTOR)
    (exec_start,) = entries["Service.ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[0] == INSTALLED_BINARY
    args = parse_with_env(argv[1:], {}, monkeypatch)
    assert args.command == "collector"
    assert args.config == "/etc/gpulens/gpulens.toml"
    (state,) = entries["Service.StateDirectory"]
    assert args.spool_dir.startswith("/var/lib/")
    assert args.spool_dir.removeprefix("/var/lib/") in state.split()  # systemd creates it, owned by the user
    assert entries["Service.WorkingDirectory"] == ["/var/lib/gpulens"]  # the default SQLite store lands there
    assert entries["Service.EnvironmentFile"] == ["-/etc/gpulens/collector.env"]


def test_the_dashboard_takes_its_settings_and_database_from_its_environment_file(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entries = unit_entries(DASHBOARD)
    (exec_start,) = entries["Service.ExecStart"]
    argv = shlex.split(exec_start)
    assert argv[0] == INSTALLED_BINARY
    assert entries["Service.EnvironmentFile"] == ["-/etc/gpulens/dashboard.env"]
    # The example lines of the unit's header are what an operator writes into that file: all of them are real.
    examples = dict(
        line.removeprefix("#").strip().split("=", 1)
        for line in DASHBOARD.read_text().splitlines()
        if re.match(r"#\s+GPULENS_[A-Z_]+=", line)
    )
    assert "GPULENS_DB_URL" in examples
    assert not unknown_twins("dashboard", examples)
    args = parse_with_env(argv[1:], examples, monkeypatch)
    assert args.command == "dashboard"
    assert args.listen == examples["GPULENS_DASHBOARD_LISTEN"]
    assert args.basic_auth_file == examples["GPULENS_DASHBOARD_BASIC_AUTH_FILE"]
    assert entries["Service.StateDirectory"] == ["gpulens"]  # the collector's SQLite store, when there is no URL


@pytest.mark.parametrize("unit", [COLLECTOR, DASHBOARD])
def test_the_collector_and_dashboard_units_are_hardened(unit: Path) -> None:
    entries = unit_entries(unit)
    single = {key: values[-1] for key, values in entries.items()}
    expected = {
        "Service.User": "gpulens",
        "Service.NoNewPrivileges": "yes",
        "Service.ProtectSystem": "strict",
        "Service.ProtectHome": "yes",
        "Service.PrivateDevices": "yes",
        "Service.ProtectProc": "invisible",
        "Service.CapabilityBoundingSet": "",
        "Service.ProtectKernelTunables": "yes",
        "Service.ProtectKernelModules": "yes",
        "Service.ProtectControlGroups": "yes",
        "Service.RestrictNamespaces": "yes",
        "Service.SystemCallArchitectures": "native",
    }
    assert {key: single.get(key) for key in expected} == expected
    assert "Service.ReadWritePaths" not in entries  # only the state directory is writable


def test_sysusers_creates_the_user_the_collector_and_dashboard_run_as(tmp_path: Path) -> None:
    sysusers = require_tool("systemd-sysusers")
    (tmp_path / "etc").mkdir()  # an empty root: sysusers writes its passwd and group files
    result = subprocess.run(
        [sysusers, f"--root={tmp_path}", str(SYSUSERS)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    users = {line.split(":")[0]: line.split(":") for line in (tmp_path / "etc" / "passwd").read_text().splitlines()}
    for unit in (COLLECTOR, DASHBOARD):
        entries = unit_entries(unit)
        (user,) = entries["Service.User"]
        assert user in users, unit.name
        assert users[user][5] == entries["Service.WorkingDirectory"][0]  # its home is the state directory
