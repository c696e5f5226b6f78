"""The dependency direction is the architecture: core <- exporter; core <- storage <- alerts <- dashboard.

Ruff's banned-api rules keep pynvml, sqlalchemy and dash in their packages; this test keeps the packages themselves
in order, lazy (function-level) imports included. Only the CLI layer of the core composes everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = {"gpulens", "exporter", "storage", "alerts", "dashboard"}
ALLOWED = {
    "gpulens": {"gpulens"},
    "exporter": {"gpulens", "exporter"},
    "storage": {"gpulens", "storage"},
    "alerts": {"gpulens", "storage", "alerts"},
    "dashboard": {"gpulens", "storage", "alerts", "dashboard"},
}
COMPOSITION_ROOT = {"gpulens/cli.py", "gpulens/demo.py", "gpulens/simulate.py"}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & OURS


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_what_lies_below_them(package: str) -> None:
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative in COMPOSITION_ROOT:
            continue
        bad = imported_packages(path) - ALLOWED[package]
        if bad:
            offenders.append(f"{relative} imports {', '.join(sorted(bad))}")
    assert not offenders, offenders
