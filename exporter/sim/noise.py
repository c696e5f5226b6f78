"""Counter-based randomness: every random value is a hash of what it belongs to, never a stateful generator.

The same (seed, entity, step) always gives the same values, whichever order snapshots are computed in, so readings
are reproducible for any virtual time and from any thread.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Final

UNITS_PER_DRAW: Final = 32
_UNPACK = struct.Struct(f"<{UNITS_PER_DRAW}H").unpack
_SCALE: Final = 1.0 / 65536.0


def key(*parts: object) -> bytes:
    """A hash key for an entity (``seed``, node, GPU, job, ...); combine with a step in ``draw``."""
    return hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=16).digest()


def draw(entity: bytes, step: int) -> tuple[float, ...]:
    """``UNITS_PER_DRAW`` independent uniform values in [0, 1) for one entity at one step."""
    digest = hashlib.blake2b(entity + step.to_bytes(8, "little", signed=True), digest_size=64).digest()
    return tuple(map(_SCALE.__mul__, _UNPACK(digest)))


def value(entity: bytes, step: int) -> float:
    """One uniform value in [0, 1) for one entity at one step (cheaper than a full ``draw``)."""
    digest = hashlib.blake2b(entity + step.to_bytes(8, "little", signed=True), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 18446744073709551616.0


def unit(*parts: object) -> float:
    """One uniform value in [0, 1) for a static property (a GPU's temperature offset, a job's period)."""
    return int.from_bytes(key(*parts)[:4], "little") / 4294967296.0


def spread(u: float, amplitude: float) -> float:
    """Map a uniform value to a symmetric offset in [-amplitude, amplitude)."""
    return (2.0 * u - 1.0) * amplitude
