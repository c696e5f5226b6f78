"""The package list, for setuptools (everything else is in pyproject.toml).

The components keep their folders at the top of the repository (``exporter/``, ``storage/``, ...) and are installed
as subpackages of ``gpulens`` (``[tool.setuptools.package-dir]``). A checkout finds them through the links in
``gpulens/``; a source distribution has no links, so each component's packages are found in its own folder here.
The wheel built from the checkout and the one built from the sdist hold the same files (tests/e2e/test_wheel.py).
"""

from setuptools import find_namespace_packages, setup

COMPONENTS = ("exporter", "storage", "collector", "alerts", "dashboard")
SKIP = ["__pycache__", "*.__pycache__"]


def packages() -> list[str]:
    core = find_namespace_packages(include=["gpulens", "gpulens.*"], exclude=SKIP)
    found = {p for p in core if p.split(".")[1:2] not in ([c] for c in COMPONENTS)}
    for component in COMPONENTS:
        found.add(f"gpulens.{component}")
        found.update(f"gpulens.{component}.{p}" for p in find_namespace_packages(component, exclude=SKIP))
    return sorted(found)


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import COMPONENTS
    setup(packages=packages())
