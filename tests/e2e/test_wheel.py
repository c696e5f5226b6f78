"""The installed package: `pip wheel .` into a new virtual environment outside the repository; and the release's
source distribution, whose own wheel holds the same files and names the same version.

The wheel installs exactly one top-level package, ``gpulens``. Without the ``server`` extra's libraries the node agent
still serves ``/metrics`` and the server commands say in one line what to install; with them ``gpulens demo`` runs.

The new environment installs the wheel alone (``--no-deps``) and finds its dependencies in this test run's own
environment through a ``.pth`` line, so the test needs no package index. A ``.pth`` line in a folder that is not a
site directory adds only that folder: the checkout's editable install is not seen there, which the test checks.
"""

from __future__ import annotations

import os
import re
import signal
import site
import subprocess
import sys
import tarfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import gpulens
from tests.conftest import free_port, http_get

ROOT = Path(__file__).resolve().parents[2]
SERVER_LIBRARIES = ("dash", "plotly", "sqlalchemy", "alembic", "psycopg", "pycurl", "apscheduler", "waitress")


@dataclass(frozen=True)
class Installed:
    venv: Path
    site_packages: Path
    wheel: Path

    @property
    def gpulens(self) -> str:
        return str(self.venv / "bin" / "gpulens")

    def env(self, *, without_server: bool = False, blocker: Path | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPULENS_", "PYTHON"))}
        if without_server and blocker is not None:
            env["PYTHONPATH"] = str(blocker)
        return env


def run(*command: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{command}: {result.stdout}\n{result.stderr}"
    return result


def build_wheel(source: Path, work: Path) -> Path:
    wheels = work / "wheels"
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(wheels),
        str(source),
        cwd=work,
    )
    (wheel,) = wheels.glob("gpulens-*.whl")
    return wheel


def install(wheel: Path, work: Path) -> Installed:
    venv = work / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", str(venv), cwd=work)
    python = venv / "bin" / "python"
    site_packages = Path(
        run(str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=work).stdout.strip()
    )
    run(
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--no-deps",
        "--target",
        str(site_packages),
        str(wheel),
        cwd=work,
    )
    # the console script, as pip writes it for an environment of its own
    script = venv / "bin" / "gpulens"
    script.write_text(f"#!{python}\nimport sys\nfrom gpulens.cli.main import main\nsys.exit(main())\n")
    script.chmod(0o755)
    (site_packages / "_test_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return Installed(venv, site_packages, wheel)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    return install(build_wheel(ROOT, work), work)


@pytest.fixture(scope="module")
def from_sdist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Installed]:
    """The sdist (setuptools' PEP 517 hook, as `make dist` calls it), unpacked: a tree with no git and no links,
    whose wheel is installed in an environment of its own."""
    work = tmp_path_factory.mktemp("sdist")
    hook = f"from setuptools import build_meta; print(build_meta.build_sdist({str(work)!r}))"
    name = run(sys.executable, "-c", hook, cwd=ROOT).stdout.strip().splitlines()[-1]
    sdist = work / name
    with tarfile.open(sdist) as archive:
        archive.extractall(work / "unpacked", filter="data")
    (tree,) = (work / "unpacked").iterdir()
    return sdist, install(build_wheel(tree, work), work)


def _files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {n for n in archive.namelist() if ".dist-info/" not in n}


def test_the_wheel_and_the_sdist_name_the_release_and_gpulens_version_prints_it(
    installed: Installed, from_sdist: tuple[Path, Installed]
) -> None:
    sdist, from_source = from_sdist
    version = gpulens.__version__
    assert version == "0.2.0"
    assert sdist.name == f"gpulens-{version}.tar.gz"
    for copy in (installed, from_source):
        assert copy.wheel.name == f"gpulens-{version}-py3-none-any.whl"
        printed = run(copy.gpulens, "--version", cwd=copy.venv).stdout
        assert printed.strip() == f"gpulens {version}"
    # the sdist's tree has no links into the components' folders: its wheel must still hold every module and asset
    assert _files(from_source.wheel) == _files(installed.wheel)
    assert "gpulens/storage/migrations/versions/v0001_initial.py" in _files(from_source.wheel)


@pytest.fixture(scope="module")
def blocker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sitecustomize that makes every server library fail to import, as on a node with the plain wheel."""
    folder = tmp_path_factory.mktemp("blocker")
    names = ", ".join(repr(n) for n in SERVER_LIBRARIES)
    (folder / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in ({names}):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Block())\n"
    )
    return folder


def test_the_wheel_installs_one_top_level_package(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as wheel:
        tops = {name.split("/")[0] for name in wheel.namelist()}
        top_level = next(n for n in wheel.namelist() if n.endswith("top_level.txt"))
        assert wheel.read(top_level).decode().split() == ["gpulens"]
    assert {t for t in tops if not t.endswith(".dist-info")} == {"gpulens"}
    # pip's --target puts the console script in bin/ beside the package (a venv's own pip puts it in the venv's bin/)
    installed_here = {p.name for p in installed.site_packages.iterdir() if not p.name.startswith("_test_")} - {"bin"}
    assert {n for n in installed_here if not n.endswith(".dist-info")} == {"gpulens"}
    for component in ("exporter", "storage", "collector", "alerts", "dashboard"):
        assert (installed.site_packages / "gpulens" / component / "__init__.py").is_file()
        assert not (installed.site_packages / "gpulens" / component).is_symlink()
    assert (installed.site_packages / "gpulens" / "storage" / "migrations" / "versions").is_dir()
    assert (installed.site_packages / "gpulens" / "dashboard" / "assets" / "vendor").is_dir()
    where = run(
        str(installed.venv / "bin" / "python"),
        "-c",
        "import gpulens.storage, gpulens; print(gpulens.__file__)",
        cwd=installed.venv,
    ).stdout
    assert where.strip().startswith(str(installed.site_packages)), where


def test_the_plain_wheel_runs_the_node_agent_without_the_server_libraries(installed: Installed, blocker: Path) -> None:
    env = installed.env(without_server=True, blocker=blocker)
    refused = subprocess.run(
        [installed.gpulens, "collector", "--target", "http://127.0.0.1:1"],
        capture_output=True,
        text=True,
        env=env,
        cwd=installed.venv,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 1, refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    pattern = r"gpulens collector: error: gpulens\.\w+ needs [a-z, ]+, which the server extra installs: "
    assert re.fullmatch(pattern + re.escape("pip install 'gpulens[server]'"), line), line
    port = free_port()
    scenario = ROOT / "examples" / "scenarios" / "healthy.toml"
    log = installed.venv / "agent.log"
    out = log.open("wb")
    agent = subprocess.Popen(
        [
            installed.gpulens,
            "exporter",
            "--source",
            "sim",
            "--scenario",
            str(scenario),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=installed.venv,
    )
    try:
        body = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and agent.poll() is None:
            try:
                status, _, body = http_get(f"http://127.0.0.1:{port}/metrics", timeout=2)
            except OSError:
                time.sleep(0.2)
                continue
            if status == 200 and b"gpulens_gpu_utilization_ratio" in body:
                break
            time.sleep(0.2)
        assert b"gpulens_gpu_utilization_ratio" in body, log.read_text()
    finally:
        agent.send_signal(signal.SIGINT)
        agent.wait(timeout=30)
        out.close()
    assert agent.returncode == 0


def test_gpulens_demo_runs_from_the_installed_wheel(installed: Installed, tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "demo.log"
    out = log.open("wb")
    demo = subprocess.Popen(
        [installed.gpulens, "demo", "--speed", "20", "--port", str(port), "--workdir", str(tmp_path / "demo")],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=installed.env(),
        cwd=tmp_path,
    )
    try:
        answered = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and demo.poll() is None:
            try:
                answered = http_get(f"http://127.0.0.1:{port}/healthz", timeout=2)
            except OSError:
                time.sleep(0.5)
                continue
            if answered[0] == 200:
                break
        assert answered is not None, log.read_text()
        assert answered[0] == 200, log.read_text()
        status, _, page = http_get(f"http://127.0.0.1:{port}/")
        assert status == 200
        assert b"gpulens" in page
    finally:
        demo.send_signal(signal.SIGINT)
        demo.wait(timeout=60)
        out.close()
    assert demo.returncode in (0, 130)
