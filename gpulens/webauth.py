"""HTTP basic auth against bcrypt hashes, shared by the exporter (``--web-config``) and the dashboard.

Every attempt that reaches the password check costs one bcrypt check, whether the user exists or not: an unknown
user is checked against a dummy hash of the same cost as the real ones, so the response time does not tell which
user names exist.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import bcrypt

DEFAULT_COST = 12


def bcrypt_cost(hashed: bytes) -> int | None:
    """The cost (log2 rounds) of a ``$2b$12$...`` hash, or None if it has none."""
    parts = hashed.split(b"$")
    if len(parts) >= 4 and parts[2].isdigit():
        return int(parts[2])
    return None


def dummy_hash(users: dict[str, bytes]) -> bytes:
    """A bcrypt hash of a random password at the highest cost among ``users``' hashes."""
    costs = [c for c in (bcrypt_cost(h) for h in users.values()) if c is not None and 4 <= c <= 31]
    rounds = max(costs) if costs else DEFAULT_COST
    return bcrypt.hashpw(secrets.token_bytes(16).hex().encode(), bcrypt.gensalt(rounds=rounds))


@dataclass
class BasicAuth:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes, caching successes (bcrypt is slow by design).

    ``checkpw`` is bcrypt's check, replaceable so tests can count the calls.
    """

    users: dict[str, bytes]
    checkpw: Callable[[bytes, bytes], bool] = bcrypt.checkpw
    _cache: dict[bytes, str] = field(default_factory=dict)
    _salt: bytes = field(default_factory=lambda: secrets.token_bytes(16))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _dummy: bytes = b""

    def __post_init__(self) -> None:
        self._dummy = dummy_hash(self.users)

    def check(self, header: str | None) -> str | None:
        """The authenticated user name, or ``None``."""
        if not header or not header.startswith("Basic "):
            return None
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, sep, password = decoded.partition(":")
        if not sep:
            return None
        hashed = self.users.get(user)
        # The cache key is a keyed digest, so the process never holds plaintext passwords after the check.
        key = hmac.new(self._salt, decoded.encode(), hashlib.sha256).digest()
        if hashed is not None:
            with self._lock:
                if self._cache.get(key) == user:
                    return user
        try:
            # An unknown user costs the same bcrypt work as a known one: the timing must not reveal user names.
            ok = self.checkpw(password.encode(), hashed if hashed is not None else self._dummy)
        except ValueError:
            return None
        if ok and hashed is not None:
            with self._lock:
                if len(self._cache) > 1024:
                    self._cache.clear()
                self._cache[key] = user
            return user
        return None
