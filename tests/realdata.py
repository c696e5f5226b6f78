"""Where the shared real-world captures are: the folder ``shared/real`` beside the repository (for a git worktree,
beside its main checkout too). Tests that read them skip, with one line, where the folder is absent; nothing from
them is copied into the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _candidates() -> list[Path]:
    roots = [ROOT.parent]
    marker = ROOT / ".git"
    if marker.is_file():  # a worktree: .git names <main>/.git/worktrees/<name>
        text = marker.read_text().strip()
        if text.startswith("gitdir:"):
            gitdir = Path(text.removeprefix("gitdir:").strip())
            roots.append(gitdir.parents[2].parent)
    return [r / "shared" / "real" for r in roots]


def real_folder(name: str) -> Path:
    """``shared/real/<name>``, or the test is skipped."""
    for base in _candidates():
        if (base / name).is_dir():
            return base / name
    pytest.skip(f"the shared real captures (../shared/real/{name}) are not beside this checkout")
