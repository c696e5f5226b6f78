"""HTTP basic auth against bcrypt hashes, shared by the exporter (``--web-config``) and the dashboard.

A header seen for the first time costs one bcrypt check, whether the user exists or not: an unknown user is checked
against a dummy hash of the same cost as the real ones, so the response time does not tell which user names exist.
The verdict is remembered by a keyed digest of the header, so the same header again, right or wrong, costs no
bcrypt. ``gpulens.authguard`` bounds how many new headers one client may have checked.
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
CACHED_HEADERS = 1024  # verdicts remembered, of each kind (right, wrong); past it the cache starts again


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


@dataclass(frozen=True)
class Attempt:
    """A parsed ``Authorization: Basic`` header: who, and the keyed digest that names it in the caches."""

    user: str
    password: bytes
    key: bytes


@dataclass
class BasicAuth:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes, remembering each header's verdict (bcrypt is slow
    by design, and a configured hash never changes while the process runs).

    ``checkpw`` is bcrypt's check, replaceable so tests can count the calls.
    """

    users: dict[str, bytes]
    checkpw: Callable[[bytes, bytes], bool] = bcrypt.checkpw
    roles: dict[str, str] = field(default_factory=dict)  # the dashboard's roles by user (gpulens.webroles)
    _cache: dict[bytes, str] = field(default_factory=dict)
    _failed: set[bytes] = field(default_factory=set)
    _salt: bytes = field(default_factory=lambda: secrets.token_bytes(16))
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _dummy: bytes = b""

    def __post_init__(self) -> None:
        self._dummy = dummy_hash(self.users)

    def check(self, header: str | None) -> str | None:
        """The authenticated user name, or ``None``."""
        attempt = self.parse(header)
        if attempt is None:
            return None
        known = self.known(attempt)
        if known is not None:
            return attempt.user if known else None
        return attempt.user if self.verify(attempt) else None

    def parse(self, header: str | None) -> Attempt | None:
        """The attempt in a header, or ``None`` for a header that is not well-formed basic auth (no bcrypt needed)."""
        if not header or not header.startswith("Basic "):
            return None
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, sep, password = decoded.partition(":")
        if not sep:
            return None
        # The cache key is a keyed digest, so the process never holds plaintext passwords after the check.
        key = hmac.new(self._salt, decoded.encode(), hashlib.sha256).digest()
        return Attempt(user, password.encode(), key)

    def known(self, attempt: Attempt) -> bool | None:
        """The verdict already reached for this exact header, or ``None`` if it needs a bcrypt check."""
        with self._lock:
            if self._cache.get(attempt.key) == attempt.user:
                return True
            if attempt.key in self._failed:
                return False
        return None

    def verify(self, attempt: Attempt) -> bool:
        """One bcrypt check, its verdict remembered (up to ``CACHED_HEADERS`` of each kind)."""
        hashed = self.users.get(attempt.user)
        try:
            # An unknown user costs the same bcrypt work as a known one: the timing must not reveal user names.
            ok = self.checkpw(attempt.password, hashed if hashed is not None else self._dummy) and hashed is not None
        except ValueError:
            ok = False
        with self._lock:
            if ok:
                if len(self._cache) >= CACHED_HEADERS:
                    self._cache.clear()
                self._cache[attempt.key] = attempt.user
            else:
                if len(self._failed) >= CACHED_HEADERS:
                    self._failed.clear()
                self._failed.add(attempt.key)
        return ok
