"""The dependency direction is the architecture.

    core (gpulens, minus gpulens.cli) <- exporter
    core <- storage <- collector <- alerts <- dashboard
    gpulens.cli (the command line and process wiring) <- nothing: it may import everything, nothing imports it.

The rules are stated by module prefix, with no list of exceptions. Every import counts, lazy (function-level) ones
included. Ruff's banned-api rules (the ``.ruff.toml`` of each package) say the same at lint time; this test also
proves there is no import circle between modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gpulens", "exporter", "storage", "collector", "alerts", "dashboard")

# Layer name -> the layers it may import. The layer of a module is the longest prefix below that matches it.
LAYERS = {
    "gpulens.cli": {"gpulens.cli", "gpulens", "exporter", "storage", "collector", "alerts", "dashboard"},
    "gpulens": {"gpulens"},
    "exporter": {"gpulens", "exporter"},
    "storage": {"gpulens", "storage"},
    "collector": {"gpulens", "storage", "collector"},
    "alerts": {"gpulens", "storage", "collector", "alerts"},
    "dashboard": {"gpulens", "storage", "collector", "alerts", "dashboard"},
}


def layer_of(module: str) -> str | None:
    matches = [name for name in LAYERS if module == name or module.startswith(name + ".")]
    return max(matches, key=len) if matches else None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every module of ours that ``path`` imports, at any depth of the file, as a dotted name."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` imports the module pkg.mod; ``from pkg import name`` imports pkg itself
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULE_NAMES else base)
    return {m for m in found if m.split(".")[0] in PACKAGES}


def _module_names() -> set[str]:
    return {
        module_name(path)
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    }


MODULE_NAMES = _module_names()


def all_modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            out[module_name(path)] = path
    return out


MODULES = all_modules()


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_each_layer_imports_only_what_lies_below_it(layer: str) -> None:
    offenders = []
    for name, path in MODULES.items():
        if layer_of(name) != layer:
            continue
        for imported in sorted(imports_of(path)):
            target = layer_of(imported)
            if target is not None and target not in LAYERS[layer]:
                offenders.append(f"{name} imports {imported} ({target})")
    assert not offenders, offenders


def test_the_core_never_imports_the_command_line() -> None:
    offenders = [
        f"{name} imports {imported}"
        for name, path in MODULES.items()
        if layer_of(name) != "gpulens.cli"
        for imported in imports_of(path)
        if layer_of(imported) == "gpulens.cli"
    ]
    assert not offenders, offenders


def test_there_is_no_import_circle_between_modules() -> None:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        graph[name] = {m for m in imports_of(path) if m in MODULES and m != name}
    # Importing a package's submodule runs the package's __init__ first: that is not an edge of ours.
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not circles, circles


def test_the_scan_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    """The scanner is what the other tests trust: it must see a function-level import."""
    source = ROOT / "gpulens" / "cli" / "cmd_collector.py"
    assert "collector.runner" in imports_of(source)
    assert layer_of("gpulens.cli.cmd_collector") == "gpulens.cli"
    assert layer_of("gpulens.model") == "gpulens"


def test_no_module_is_over_550_lines() -> None:
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 550}
    assert not long, long
