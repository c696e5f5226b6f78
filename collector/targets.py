"""Scrape targets: the static list from the config, Prometheus ``file_sd`` files re-read when they change, and sharding.

Sharding is stable and documented: a collector started with ``--shard I/N`` scrapes the targets for which
``int(sha256(name)[:8 bytes]) % N == I``. Every collector of a cluster computes the same split from the same names, so
N collectors cover every target exactly once.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpulens.logutil import LogOnce
from gpulens.settings import FileSdSettings, Settings, TargetSettings, TlsAuth

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    name: str
    url: str  # base URL (gpulens) or /metrics URL (dcgm)
    kind: str = "gpulens"
    node: str | None = None
    auth: TlsAuth = field(default_factory=TlsAuth)

    @property
    def scrape_url(self) -> str:
        return self.url if self.kind == "dcgm" else self.url.rstrip("/") + "/api/v1/snapshot"


def shard_of(name: str, shards: int) -> int:
    """The shard (0..shards-1) that scrapes the target called ``name``."""
    digest = hashlib.sha256(name.encode()).digest()
    return int.from_bytes(digest[:8], "big") % shards


def in_shard(targets: Iterable[Target], shard: tuple[int, int]) -> list[Target]:
    index, count = shard
    return [t for t in targets if count == 1 or shard_of(t.name, count) == index]


def _target_from_sd(entry: str, labels: dict[str, Any], sd: FileSdSettings) -> Target:
    if "://" in entry:
        url = entry.rstrip("/")
    else:
        scheme = str(labels.get("__scheme__", "http"))
        path = str(labels.get("__metrics_path__", "")) if sd.kind == "dcgm" else ""
        if sd.kind == "dcgm" and not path:
            path = "/metrics"
        url = f"{scheme}://{entry}{path}"
    name = str(labels.get("__name__", labels.get("instance", url)))
    node = labels.get("node")
    return Target(name=name, url=url, kind=sd.kind, node=str(node) if node else None, auth=sd.auth)


class FileSd:
    """Targets from Prometheus file_sd files; a file is re-read only when its mtime or size changes."""

    def __init__(self, settings: Sequence[FileSdSettings]) -> None:
        self._settings = settings
        self._cache: dict[str, tuple[tuple[float, int], list[Target]]] = {}
        self._log_once = LogOnce(log)
        self.errors = 0

    def targets(self) -> list[Target]:
        found: list[Target] = []
        seen_files: set[str] = set()
        for sd in self._settings:
            for pattern in sd.files:
                for path in sorted(glob.glob(pattern)) or ([pattern] if not glob.has_magic(pattern) else []):
                    seen_files.add(path)
                    found.extend(self._read(path, sd))
        for stale in set(self._cache) - seen_files:
            del self._cache[stale]
        return found

    def _read(self, path: str, sd: FileSdSettings) -> list[Target]:
        try:
            st = os.stat(path)
        except OSError as exc:
            self.errors += 1
            self._log_once(f"missing:{path}", "file_sd %s: %s (kept trying)", path, exc.strerror)
            return []
        stamp = (st.st_mtime, st.st_size)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            targets = self._parse(Path(path), sd)
        except (OSError, ValueError, yaml.YAMLError) as exc:
            self.errors += 1
            log.warning("file_sd %s is invalid, keeping its previous targets: %s", path, exc)
            return cached[1] if cached is not None else []
        self._cache[path] = (stamp, targets)
        log.info("file_sd %s: %d targets", path, len(targets))
        return targets

    @staticmethod
    def _parse(path: Path, sd: FileSdSettings) -> list[Target]:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        if not isinstance(data, list):
            raise ValueError("expected a list of {targets: [...], labels: {...}} groups")
        out: list[Target] = []
        for i, group in enumerate(data):
            if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
                raise ValueError(f"group {i}: expected an object with a 'targets' list")
            labels = group.get("labels") or {}
            if not isinstance(labels, dict):
                raise ValueError(f"group {i}: 'labels' must be an object")
            for entry in group["targets"]:
                if not isinstance(entry, str) or not entry:
                    raise ValueError(f"group {i}: targets must be non-empty strings")
                out.append(_target_from_sd(entry, labels, sd))
        return out


class TargetSet:
    """All the targets this collector scrapes: static plus discovered, deduplicated by name, filtered by shard."""

    def __init__(self, settings: Settings) -> None:
        self._static = [self._static_target(t) for t in settings.targets]
        self._file_sd = FileSd(settings.file_sd)
        self._shard = settings.shard

    @staticmethod
    def _static_target(t: TargetSettings) -> Target:
        return Target(name=t.name, url=t.url, kind=t.kind, node=t.node, auth=t.auth)

    @property
    def file_sd_errors(self) -> int:
        return self._file_sd.errors

    def current(self) -> list[Target]:
        by_name: dict[str, Target] = {}
        for target in [*self._static, *self._file_sd.targets()]:
            by_name.setdefault(target.name, target)
        return in_shard(by_name.values(), self._shard)
