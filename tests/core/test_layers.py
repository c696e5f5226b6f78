"""The dependency direction is the architecture.

    core (gpulens, minus its subpackages below) <- gpulens.exporter
    core <- gpulens.storage <- gpulens.collector <- gpulens.alerts <- gpulens.dashboard
    gpulens.cli (the command line and process wiring) <- nothing: it may import everything, nothing imports it.

The components live in top-level folders of the repository (exporter/, storage/, ...) and are installed as
subpackages of ``gpulens``: nothing imports them under their folder's name. The rules are stated by module prefix,
with no list of exceptions. Every import counts, lazy (function-level) ones
included. Ruff's banned-api rules (the ``.ruff.toml`` of each package) say the same at lint time; this test also
proves there is no import circle between modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = ("exporter", "storage", "collector", "alerts", "dashboard")  # top-level folders, gpulens.<name> installed
PACKAGES = ("gpulens", *COMPONENTS)

E, S, C, A, D = (f"gpulens.{name}" for name in COMPONENTS)
# Layer name -> the layers it may import. The layer of a module is the longest prefix below that matches it.
LAYERS = {
    "gpulens.cli": {"gpulens.cli", "gpulens", E, S, C, A, D},
    "gpulens": {"gpulens"},
    E: {"gpulens", E},
    S: {"gpulens", S},
    C: {"gpulens", S, C},
    A: {"gpulens", S, C, A},
    D: {"gpulens", S, C, A, D},
}


def layer_of(module: str) -> str | None:
    matches = [name for name in LAYERS if module == name or module.startswith(name + ".")]
    return max(matches, key=len) if matches else None


def module_name(path: Path) -> str:
    """The installed name: ``exporter/agent.py`` is ``gpulens.exporter.agent``."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] in COMPONENTS:
        parts.insert(0, "gpulens")
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


def source_files(*folders: str) -> list[Path]:
    """The Python files of ``folders`` as they lie in the repository (the links in gpulens/ are not followed)."""
    out = []
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            relative = path.relative_to(ROOT).parts
            if relative[0] == "gpulens" and len(relative) > 1 and relative[1] in COMPONENTS:
                continue
            out.append(path)
    return out


def _module_names() -> set[str]:
    return {module_name(path) for path in source_files(*PACKAGES) if "migrations" not in path.parts}


MODULE_NAMES = _module_names()


def all_modules() -> dict[str, Path]:
    return {module_name(path): path for path in source_files(*PACKAGES) if "migrations" not in path.parts}


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
    assert "gpulens.collector.runner" in imports_of(source)
    assert module_name(ROOT / "exporter" / "sim" / "__init__.py") == "gpulens.exporter.sim"
    assert layer_of("gpulens.cli.cmd_collector") == "gpulens.cli"
    assert layer_of("gpulens.model") == "gpulens"


def test_no_module_is_over_550_lines() -> None:
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 550}
    assert not long, long


def test_nothing_imports_a_component_by_its_folder_name() -> None:
    """``import storage`` would work from the checkout but not from the wheel, and would load a second copy."""
    offenders = []
    for path in source_files(*PACKAGES, "tests", "bench"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [
                f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in COMPONENTS
            ]
    assert not offenders, offenders


def test_each_component_is_linked_into_the_package() -> None:
    """gpulens/<component> leads to the top-level folder, so the checkout imports what the wheel installs."""
    for name in COMPONENTS:
        link = ROOT / "gpulens" / name
        assert link.is_symlink(), link
        assert link.resolve() == (ROOT / name).resolve()
