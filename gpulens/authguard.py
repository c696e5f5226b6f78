"""Bounded basic-auth work for ``gpulens.httpserver``: how many bcrypt checks clients can make the server run.

``BasicAuth`` remembers each header's verdict, so a right password costs one bcrypt check per distinct header and a
repeated wrong one costs none. What is left is a client sending new wrong passwords: each one is a bcrypt check
(tens of milliseconds of CPU at cost 10 to 12). Two limits bound that work:

- per client address, a token bucket of checks that failed: ``burst`` at once, then one more every ``refill_s``
  seconds. An address with no token left gets 429 (with ``Retry-After``) without a check; a check that succeeds
  gives its token back, so only failures drain the bucket.
- across all clients, at most ``concurrent`` bcrypt checks run at once. A check waits up to ``wait_s`` for its turn,
  then the request gets 429 too.

A header whose verdict is known (right or wrong) never waits for either limit. Refusals are counted in
``AuthGuard.refused`` and logged at most once a minute, naming the address only.
"""

from __future__ import annotations

import enum
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from gpulens.webauth import BasicAuth

log = logging.getLogger(__name__)

LOG_EVERY_S = 60.0


def _half_the_cores() -> int:
    return max(1, (os.cpu_count() or 2) // 2)


@dataclass(frozen=True)
class AuthLimits:
    burst: int = 5  # failed checks an address may cause at once
    refill_s: float = 10.0  # then one more every refill_s seconds
    concurrent: int = field(default_factory=_half_the_cores)  # bcrypt checks at once, all clients together
    wait_s: float = 5.0  # how long a check waits for its turn before the request is refused
    addresses: int = 4096  # client addresses remembered; past it the least recently seen is forgotten


class Verdict(enum.Enum):
    ALLOWED = "allowed"
    DENIED = "denied"  # 401
    REFUSED = "refused"  # 429: too many failed checks from this address, or too many checks at once


@dataclass
class _Bucket:
    tokens: float
    stamp: float


class AuthGuard:
    """Decides whether a request's ``Authorization`` header may be answered, within ``limits``. Without basic auth
    every request is allowed."""

    def __init__(
        self,
        auth: BasicAuth | None,
        limits: AuthLimits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.auth = auth
        self.limits = limits or AuthLimits()
        self._clock = clock
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._lock = threading.Lock()
        self._turns = threading.BoundedSemaphore(max(1, self.limits.concurrent))
        self._logged_at: float | None = None
        self.refused = 0  # requests answered 429
        self.checks = 0  # bcrypt checks run

    def check(self, header: str | None, address: str) -> Verdict:
        if self.auth is None:
            return Verdict.ALLOWED
        attempt = self.auth.parse(header)
        if attempt is None:
            return Verdict.DENIED
        known = self.auth.known(attempt)
        if known is not None:
            return Verdict.ALLOWED if known else Verdict.DENIED
        if not self._take(address):
            return self._refuse(address)
        if not self._turns.acquire(timeout=self.limits.wait_s):
            self._give(address)
            return self._refuse(address)
        try:
            with self._lock:
                self.checks += 1
            ok = self.auth.verify(attempt)
        finally:
            self._turns.release()
        if ok:
            self._give(address)
            return Verdict.ALLOWED
        return Verdict.DENIED

    def retry_after_s(self, address: str) -> int:
        """Whole seconds until ``address`` has a token again (at least 1)."""
        with self._lock:
            bucket = self._buckets.get(address)
            missing = 1.0 - bucket.tokens if bucket is not None else 0.0
        return max(1, math.ceil(missing * self.limits.refill_s))

    def _bucket(self, address: str, now: float) -> _Bucket:
        """The address's bucket, refilled to ``now`` (called with the lock held)."""
        limits = self.limits
        bucket = self._buckets.get(address)
        if bucket is None:
            bucket = self._buckets[address] = _Bucket(float(limits.burst), now)
            while len(self._buckets) > limits.addresses:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(address)
            earned = (now - bucket.stamp) / limits.refill_s if limits.refill_s > 0 else math.inf
            bucket.tokens = min(float(limits.burst), bucket.tokens + earned)
            bucket.stamp = now
        return bucket

    def _take(self, address: str) -> bool:
        with self._lock:
            bucket = self._bucket(address, self._clock())
            if bucket.tokens < 1.0:
                return False
            bucket.tokens -= 1.0
            return True

    def _give(self, address: str) -> None:
        with self._lock:
            bucket = self._bucket(address, self._clock())
            bucket.tokens = min(float(self.limits.burst), bucket.tokens + 1.0)

    def _refuse(self, address: str) -> Verdict:
        now = self._clock()
        with self._lock:
            self.refused += 1
            quiet = self._logged_at is not None and now - self._logged_at < LOG_EVERY_S
            if not quiet:
                self._logged_at = now
            refused = self.refused
        if not quiet:
            log.warning(
                "basic auth: refusing %s (too many failed logins or checks at once; %d refused in all)",
                address,
                refused,
            )
        return Verdict.REFUSED
