"""HTTP basic auth against bcrypt hashes, shared by the exporter (``--web-config``) and the dashboard."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import threading
from dataclasses import dataclass, field

import bcrypt


@dataclass
class BasicAuth:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes, caching successes (bcrypt is slow by design)."""

    users: dict[str, bytes]
    _cache: dict[bytes, str] = field(default_factory=dict)
    _salt: bytes = field(default_factory=lambda: secrets.token_bytes(16))
    _lock: threading.Lock = field(default_factory=threading.Lock)

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
        if hashed is None:
            return None
        # The cache key is a keyed digest, so the process never holds plaintext passwords after the check.
        key = hmac.new(self._salt, decoded.encode(), hashlib.sha256).digest()
        with self._lock:
            if self._cache.get(key) == user:
                return user
        try:
            ok = bcrypt.checkpw(password.encode(), hashed)
        except ValueError:
            return None
        if ok:
            with self._lock:
                if len(self._cache) > 1024:
                    self._cache.clear()
                self._cache[key] = user
            return user
        return None
