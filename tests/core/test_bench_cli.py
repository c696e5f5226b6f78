"""Every benchmark module answers ``--help`` with what it measures, and refuses an unknown argument, without running."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULES = sorted(m.name for m in pkgutil.iter_modules([str(ROOT / "bench")]) if m.name.startswith("bench_"))


def _run(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def test_every_benchmark_module_is_covered() -> None:
    assert len(MODULES) >= 13
    assert {"bench_storage", "bench_prometheus", "bench_sim"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_help_describes_the_benchmark_and_runs_nothing(name: str) -> None:
    done = _run(f"bench.{name}", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m bench.{name}")
    first_line = (ROOT / "bench" / f"{name}.py").read_text().split('"""')[1].split("\n")[0].strip()
    assert " ".join(first_line.split()[:4]) in " ".join(done.stdout.split())  # the docstring's description
    assert "Traceback" not in done.stderr
    assert not [line for line in done.stdout.splitlines() if line.startswith(("alerts_", "sqlite_", "sim_"))]


@pytest.mark.parametrize("name", MODULES)
def test_an_unknown_argument_is_one_clear_error(name: str) -> None:
    done = _run(f"bench.{name}", "--no-such-option")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"python -m bench.{name}: error: unrecognized arguments: --no-such-option"
    )
    assert done.stdout == ""


def test_the_runner_names_its_modules_and_refuses_an_unknown_one() -> None:
    done = _run("bench", "--help")
    assert done.returncode == 0
    assert "bench_storage" in done.stdout
    assert "examples:" in done.stdout
    done = _run("bench", "no_such_bench")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == "python -m bench: error: no benchmark module matches 'no_such_bench'"


def test_the_rebuild_bench_refuses_a_part_of_an_hour() -> None:
    """The rebuild covers whole hours: a part hour's rebuilt rows could not be compared with the live ones."""
    done = _run("bench.bench_rebuild", "--hours", "0.1")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "python -m bench.bench_rebuild: error: argument --hours: '0.1' is not a whole number of hours"
        " (the rebuild covers whole hours)"
    )
