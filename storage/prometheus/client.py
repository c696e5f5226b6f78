"""The Prometheus HTTP API client: instant and range queries, PromQL quoting, credentials, errors in plain words.

It speaks the query API that Prometheus, Thanos Query, Grafana Mimir and VictoriaMetrics share (``/api/v1/query``,
``/api/v1/query_range``), by POST so that a long selector fits, through the one HTTP client
(``gpulens.httpfetch``: a whole-request deadline and a size cap). Credentials come from the settings or the
environment (``GPULENS_DB_USERNAME``/``GPULENS_DB_PASSWORD``, ``GPULENS_DB_BEARER_TOKEN``), never from the URL's
command line; a store that cannot be reached raises ``DatabaseUnavailableError`` like an SQL store does.
"""

from __future__ import annotations

import base64
import os
import ssl
import threading
import urllib.error
import urllib.parse
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from http.client import HTTPException
from typing import Any, Final

import msgspec

from gpulens.config import ConfigError
from gpulens.gcpause import gc_paused
from gpulens.httpfetch import redact_url, request, scrub
from gpulens.settings import StoreAuth
from gpulens.storage.reading import DatabaseUnavailableError, TooManySeriesError

SCHEMES: Final = ("prometheus+http", "prometheus+https")
MAX_RESPONSE_BYTES: Final = 256 * 1024 * 1024
LOOKBACK_S: Final = 300.0  # the default lookback: an instant query sees samples up to this old (VictoriaMetrics too)


def quote(text: str) -> str:
    """``text`` as a PromQL double-quoted string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


# The characters RE2 (Prometheus's regular expressions) treats as special outside a character class. Python's
# re.escape escapes more ("-", "#", "&", "~", space): harmless to the match, but an alternation with escapes is
# matched value by value, not looked up as a set. The uuid matcher of 2,667 of the bench's 8,000 GPUs cost
# Prometheus 0.15 CPU-s escaped and 0.10 unescaped (as much as selecting every GPU).
_RE2_SPECIAL: Final = {ord(c): "\\" + c for c in "\\.+*?()|[]{}^$"}


def regex_escape(text: str) -> str:
    """``text`` as an RE2 regular expression matching exactly itself."""
    return text.translate(_RE2_SPECIAL)


def regex_of(values: Any) -> str:
    """A PromQL regex (quoted) matching exactly the given strings."""
    return quote("|".join(regex_escape(str(v)) for v in sorted(set(values))))


class _Answer(msgspec.Struct):
    """The API's envelope; ``data`` left encoded until its shape is known."""

    status: str = ""
    error: str = ""
    data: msgspec.Raw = msgspec.Raw(b"null")


class _Data(msgspec.Struct):
    resultType: str = ""  # noqa: N815 (the API's name)
    result: msgspec.Raw = msgspec.Raw(b"[]")


class _Item(msgspec.Struct):
    """One series of a vector (``value``) or matrix (``values``) result; sample values are strings in the API,
    read as floats (``strict=False``: "NaN", "Inf", "-Inf"; "+Inf" is read by ``_slow_items``)."""

    metric: dict[str, str] = {}
    value: tuple[float, float] | None = None
    values: tuple[tuple[float, float], ...] = ()


_ANSWER: Final = msgspec.json.Decoder(_Answer)
_DATA: Final = msgspec.json.Decoder(_Data)
_ITEMS: Final = msgspec.json.Decoder(list[_Item], strict=False)
_ANY: Final = msgspec.json.Decoder()


def _slow_items(raw: bytes) -> list[_Item]:
    """The result read value by value (``float()`` reads "+Inf")."""
    out = []
    for item in _ANY.decode(raw):
        value = item.get("value")
        out.append(
            _Item(
                item.get("metric", {}),
                None if value is None else (float(value[0]), float(value[1])),
                tuple((float(t), float(v)) for t, v in item.get("values", ())),
            )
        )
    return out


def _shortened(error: str, keep: int = 400) -> str:
    """An error text with its middle left out when long: VictoriaMetrics's quote the whole query (100 KB where it
    lists thousands of GPUs), and the reason comes last."""
    return error if len(error) <= 2 * keep else f"{error[:keep]} ... {error[-keep:]}"


class PromQueryError(ValueError):
    """Prometheus refused a query (bad PromQL, too many samples, a timeout on its side)."""


@dataclass(frozen=True, slots=True)
class PromSeries:
    """One series of a result: its labels and its (time, value) samples (one for an instant query)."""

    labels: Mapping[str, str]
    samples: tuple[tuple[float, float], ...]

    @property
    def value(self) -> float:
        return self.samples[-1][1]


@dataclass
class QueryStats:
    """How many queries a reader made and how long they took (for the docs' cost figures and tests)."""

    queries: int = 0
    seconds: float = 0.0
    series: int = 0


class PromClient:
    """Queries one Prometheus-compatible API at ``url`` (``prometheus+http(s)://host:port[/path]``)."""

    def __init__(
        self, url: str, auth: StoreAuth | None = None, *, timeout_s: float = 30.0, environ: Mapping[str, str] | None
    ) -> None:
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() not in SCHEMES or not rest.split("/", 1)[0]:
            raise ValueError("a Prometheus URL looks like prometheus+http://HOST:PORT[/path] or prometheus+https://...")
        if "@" in rest.split("/", 1)[0]:
            raise ConfigError(
                "put Prometheus credentials in [database] username/password_env or GPULENS_DB_PASSWORD, not the URL",
                key="--db",
            )
        self.base = scheme.lower().removeprefix("prometheus+") + "://" + rest.rstrip("/")
        self.url_redacted = redact_url(url)
        self.auth = auth or StoreAuth()
        self.timeout_s = timeout_s
        self.stats = QueryStats()
        self._lock = threading.Lock()
        self._environ = os.environ if environ is None else environ
        self._secrets: list[str] = []
        self._headers = self._auth_headers()
        self._context = self._ssl_context()

    def _auth_headers(self) -> dict[str, str]:
        tls = self.auth.tls
        token = self.auth.bearer_token() or self._environ.get("GPULENS_DB_BEARER_TOKEN")
        username = tls.username or self._environ.get("GPULENS_DB_USERNAME")
        password = tls.password() if tls.username else self._environ.get("GPULENS_DB_PASSWORD")
        headers = {"User-Agent": "gpulens", "Accept-Encoding": "gzip"}
        if self.auth.tenant:
            headers["X-Scope-OrgID"] = self.auth.tenant
        if token:
            headers["Authorization"] = "Bearer " + token
            self._secrets.append(token)
        elif username:
            raw = f"{username}:{password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(raw).decode("ascii")
            self._secrets += [s for s in (password, username) if s]
        return headers

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self.base.startswith("https://"):
            return None
        tls = self.auth.tls
        context = ssl.create_default_context(cafile=tls.ca_file) if tls.ca_file else ssl.create_default_context()
        if tls.insecure_skip_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def scrub(self, text: str) -> str:
        return scrub(text, *self._secrets)

    def _post(self, path: str, form: Mapping[str, str], *, method: str = "POST") -> Any:
        import time

        encoded = urllib.parse.urlencode(form)
        data = encoded.encode() if method == "POST" else None
        url = self.base + path + ("" if method == "POST" else "?" + encoded)
        headers = {**self._headers, "Content-Type": "application/x-www-form-urlencoded"}
        started = time.perf_counter()
        try:
            response = request(
                url,
                timeout_s=self.timeout_s,
                max_bytes=MAX_RESPONSE_BYTES,
                method=method,
                data=data,
                headers=headers,
                decode=True,
                context=self._context,
            )
        except urllib.error.URLError as exc:
            raise self._unavailable(f"cannot be reached: {exc.reason}") from None
        except TimeoutError:
            raise self._unavailable(f"timed out after {self.timeout_s:g} s") from None
        except (OSError, HTTPException, zlib.error) as exc:
            raise self._unavailable(f"failed: {type(exc).__name__}: {exc}") from None
        finally:
            with self._lock:
                self.stats.queries += 1
                self.stats.seconds += time.perf_counter() - started
        body = response.body
        if body[:2] == b"\x1f\x8b":  # an error body is read as sent (gzip)
            try:
                body = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(body)
            except zlib.error:
                body = b""
        try:
            doc: _Answer | None = _ANSWER.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            doc = None
        if response.status in (401, 403):
            raise ConfigError(
                f"Prometheus at {self.url_redacted} answered HTTP {response.status}: check [database] username, "
                "password_env/password_file or bearer_token_env/bearer_token_file"
            )
        if doc is None or doc.status != "success":
            error = doc.error if doc is not None else ""
            if response.status >= 500 and not error:
                raise self._unavailable(f"answered HTTP {response.status}")
            raise PromQueryError(
                self.scrub(f"Prometheus at {self.url_redacted} refused a query: {_shortened(error) or response.status}")
            )
        return doc.data

    def _unavailable(self, problem: str) -> DatabaseUnavailableError:
        return DatabaseUnavailableError(self.scrub(f"Prometheus at {self.url_redacted} {problem}"))

    def metric_names(self, start: float, end: float) -> set[str]:
        """The metric names holding samples between ``start`` and ``end`` (the label values API: an index read)."""
        form = {"start": f"{start:.3f}", "end": f"{end:.3f}"}
        data = _ANY.decode(self._post("/api/v1/label/__name__/values", form, method="GET"))
        return {str(name) for name in data} if isinstance(data, list) else set()

    def query(self, promql: str, at: float, *, max_series: int | None = None) -> list[PromSeries]:
        """An instant query evaluated at ``at``."""
        # nocache=1: VictoriaMetrics answers at ``at``, not -search.latencyOffset (30 s) before it when ``at`` is
        # about now (readings 30 s older than the scrape: the alert engine's read of readings under 30 s old, at an
        # --interval of 10 s or less, would find none); Prometheus ignores it, as any parameter it does not know
        # (docs/victoriametrics.md).
        form = {"query": promql, "time": f"{at:.3f}", "nocache": "1"}
        data = self._post("/api/v1/query", form)
        return self._series(data, max_series, promql)

    def query_range(
        self, promql: str, start: float, end: float, step: float, *, max_series: int | None = None
    ) -> list[PromSeries]:
        """A range query at ``step`` over [start, end]."""
        form = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return self._series(self._post("/api/v1/query_range", form), max_series, promql)

    def _series(self, raw: msgspec.Raw, max_series: int | None, promql: str) -> list[PromSeries]:
        with gc_paused():  # the answer's objects live on: no collection walks them while it is built
            return self._decoded(raw, max_series)

    def _decoded(self, raw: msgspec.Raw, max_series: int | None) -> list[PromSeries]:
        try:
            data = _DATA.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise PromQueryError(f"Prometheus at {self.url_redacted} answered a query with no result") from None
        if data.resultType == "scalar":
            t, v = _ANY.decode(data.result)
            return [PromSeries({}, ((float(t), float(v)),))]
        try:
            result = _ITEMS.decode(data.result)
        except msgspec.ValidationError:
            result = _slow_items(data.result)
        limit = self.auth.max_series if max_series is None else max_series
        if len(result) > limit:
            raise TooManySeriesError(
                f"a query returned {len(result)} series, over the limit of {limit} ([database] max_series): narrow "
                "the range or the GPUs shown, or raise the limit"
            )
        with self._lock:
            self.stats.series += len(result)
        return [PromSeries(i.metric, i.values if i.value is None else (i.value,)) for i in result]

    def close(self) -> None:
        """Nothing held open: each query is one request."""
