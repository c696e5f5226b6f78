"""A bounded on-disk spool of scrape rounds that could not be written, replayed in order once the database is back.

Each round is one gzipped JSON file named by a sequence number, written atomically (temporary file, fsync, rename),
so a killed collector leaves only whole rounds behind and replays them when it starts again. The writer's inserts
are idempotent, so a round replayed twice (killed between the write and the removal) is still stored once. When
the spool would grow past its limit, the oldest rounds are dropped, counted and logged: the one way data is lost.
"""

from __future__ import annotations

import dataclasses
import gzip
import logging
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import orjson

from gpulens.model import NodeSnapshot, SnapshotFormatError, TargetHealth
from gpulens.snapshotcodec import LAYOUT_COLUMNAR, snapshot_from_bytes, snapshot_to_json

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(\d{16})\.json\.gz$")


class _SpooledDocument(msgspec.Struct):
    # Each snapshot stays JSON text until the snapshot codec decodes it (either layout: older spools hold rows).
    snapshots: list[msgspec.Raw]
    targets: list[dict[str, Any]]


_DECODER = msgspec.json.Decoder(_SpooledDocument)


@dataclasses.dataclass(frozen=True)
class SpooledRound:
    path: Path
    snapshots: tuple[NodeSnapshot, ...]
    targets: tuple[TargetHealth, ...]


class Spool:
    def __init__(self, directory: str | Path, *, max_bytes: int = 1024**3) -> None:
        self._dir = Path(directory)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self.dropped_rounds = 0
        for leftover in self._dir.glob("*.tmp"):  # a write interrupted by a kill
            leftover.unlink(missing_ok=True)
        files = self._files()
        self._next = (int(_NAME.match(files[-1].name).group(1)) + 1) if files else 0  # type: ignore[union-attr]
        if files:
            log.info("spool %s holds %d round(s) to replay", self._dir, len(files))

    def _files(self) -> list[Path]:
        return sorted(p for p in self._dir.iterdir() if _NAME.match(p.name))

    @property
    def depth(self) -> int:
        return len(self._files())

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self._files())

    def append(self, snapshots: Sequence[NodeSnapshot], targets: Sequence[TargetHealth]) -> Path:
        doc: dict[str, Any] = {
            "snapshots": [snapshot_to_json(s, layout=LAYOUT_COLUMNAR) for s in snapshots],
            "targets": [dataclasses.asdict(t) for t in targets],
        }
        data = gzip.compress(orjson.dumps(doc), compresslevel=1)
        with self._lock:
            path = self._dir / f"{self._next:016d}.json.gz"
            self._next += 1
            tmp = path.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            tmp.rename(path)
            self._enforce_limit()
        return path

    def _enforce_limit(self) -> None:
        files = self._files()
        total = sum(p.stat().st_size for p in files)
        while total > self._max_bytes and len(files) > 1:
            oldest = files.pop(0)
            total -= oldest.stat().st_size
            oldest.unlink(missing_ok=True)
            self.dropped_rounds += 1
            log.error(
                "spool %s is over its %d-byte limit: dropped the oldest round %s",
                self._dir,
                self._max_bytes,
                oldest.name,
            )

    def pending(self) -> list[Path]:
        """Spooled rounds, oldest first."""
        return self._files()

    def load(self, path: Path) -> SpooledRound:
        """Read one spooled round. Raises ``ValueError`` for a damaged file (which the caller sets aside)."""
        try:
            doc = _DECODER.decode(gzip.decompress(path.read_bytes()))
            snapshots = tuple(snapshot_from_bytes(s) for s in doc.snapshots)
            targets = tuple(TargetHealth(**t) for t in doc.targets)
        except (OSError, EOFError, gzip.BadGzipFile, msgspec.DecodeError, TypeError) as exc:
            raise ValueError(f"spooled round {path.name} is damaged: {exc}") from None
        except SnapshotFormatError as exc:
            raise ValueError(f"spooled round {path.name} is damaged: {exc}") from None
        return SpooledRound(path, snapshots, targets)

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)

    def set_aside(self, path: Path) -> None:
        """Move a damaged file out of the replay order, keeping it for a person to look at."""
        path.rename(path.with_name(path.name + ".damaged"))
