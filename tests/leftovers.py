"""The processes a test run leaves behind: what ``pytest_sessionfinish`` checks after it stopped the test Slurm.

A process is the run's when its name is one the tests start (``WATCHED``, or Python running ``gpulens.cli``, as the
tests start gpulens) and its command line names a folder of the run: pytest's base temporary folder (every test's
``tmp_path`` lies under it, workers' included) or the test Slurm's folder. Only those processes' names and command
lines are read, from /proc."""

from __future__ import annotations

from pathlib import Path
from typing import Final

WATCHED: Final = frozenset(
    {"slurmctld", "slurmd", "munged", "prometheus", "gpulens", "alertmanager", "victoria-metric", "vmalert"}
)  # /proc/PID/comm keeps the first 15 characters of a name


def leftover_processes(folders: list[Path], proc: Path = Path("/proc")) -> list[str]:
    """``pid name`` of each watched process whose command line names one of ``folders``."""
    marks = [str(f) for f in folders]
    found: list[str] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
            if name not in WATCHED and not name.startswith("python"):
                continue
            if (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue  # exited, not yet reaped
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue  # gone meanwhile
        if name.startswith("python") and "gpulens.cli" not in argv:
            continue
        if any(mark in argv for mark in marks):
            found.append(f"{entry.name} {name}")
    return sorted(found)
