"""What the dashboard's responses get on the way out: gzip for clients that accept it, and a year's immutable caching
for Dash's fingerprinted assets. A WSGI middleware around the Flask app that Dash builds.

Dash serves its component bundles under ``/_dash-component-suites/<package>/<file>``, with the package version and
the file's modification time in the name (``plotly.v2_35_2m1700000000.min.js``, see ``dash.fingerprint``): a new
version is a new URL, so such a response can be cached for a year and marked immutable. So is an asset of the app's
own folder, which Dash links as ``/assets/<file>?m=<modification time>`` (an edited file is a new URL): without it
the browser revalidates the stylesheet and script on every page load before the page can start. So is a vendored
library under ``/assets/vendor/``, its version in its name (the dashboard's partial Plotly bundle). The Plotly bundle is
4.8 MB; gzipped, about a third of that. Compressed fingerprinted assets are kept in memory (they never change).

Dash loads Plotly itself from a URL without a fingerprint (``.../plotly/package_data/plotly.min.js``), with an
entity tag: the gzipped variant keeps a tag of its own (``"<tag>-gzip"``), so that the browser revalidates it (a
304, no body) instead of fetching 4.8 MB again on every page load; compressed bodies with a tag are cached under it.
"""

from __future__ import annotations

import gzip
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Final

COMPONENT_SUITES: Final = "/_dash-component-suites/"
ASSETS: Final = "/assets/"
_ASSET_VERSION: Final = re.compile(r"^m=[0-9.]+$")  # Dash links each asset with its modification time
_FINGERPRINT: Final = re.compile(r"^v[\w-]+m[0-9a-fA-F]+$")  # dash.fingerprint's: v<version>m<hash>
VENDOR: Final = ASSETS + "vendor/"
_VENDORED: Final = re.compile(r"^[a-z][\w-]*-\d+\.\d+\.\d+(\.min)?\.js$")  # a vendored library, its version in the name
IMMUTABLE: Final = "public, max-age=31536000, immutable"
COMPRESSIBLE: Final = (
    "text/",
    "application/javascript",
    "application/json",
    "application/x-javascript",
    "image/svg+xml",
)
GZIP_TAG: Final = "-gzip"  # appended inside a compressed response's entity tag
MIN_SIZE: Final = 512  # smaller bodies gain nothing from gzip's 20-byte header

Environ = dict[str, Any]
StartResponse = Callable[..., Callable[[bytes], object]]
WsgiApp = Callable[[Environ, StartResponse], Iterable[bytes]]


def fingerprinted(path: str) -> bool:
    """True for a Dash component-suite URL whose file name carries a version and hash."""
    if not path.startswith(COMPONENT_SUITES):
        return False
    parts = path.rsplit("/", 1)[-1].split(".")
    return len(parts) > 2 and bool(_FINGERPRINT.match(parts[1]))


def versioned_asset(path: str, query: str) -> bool:
    """True for a file of the app's assets folder as Dash links it: ``/assets/x.css?m=<modification time>``."""
    return path.startswith(ASSETS) and bool(_ASSET_VERSION.match(query))


def vendored(path: str) -> bool:
    """True for a third-party file of the assets' ``vendor/`` folder whose name carries its version
    (``plotly-cartesian-4.1.1.min.js``): another version is another name, so its content never changes."""
    return path.startswith(VENDOR) and bool(_VENDORED.match(path[len(VENDOR) :]))


def accepts_gzip(environ: Environ) -> bool:
    for part in str(environ.get("HTTP_ACCEPT_ENCODING", "")).split(","):
        coding, _, params = part.strip().partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            q = params.strip().lower()
            return not (q.startswith("q=") and _q(q[2:]) == 0.0)
    return False


def _q(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 1.0


class CompressAndCache:
    """gzip and cache headers around a WSGI app."""

    def __init__(self, app: WsgiApp, *, level: int = 6, cached_assets: int = 64) -> None:
        self._app = app
        self._level = level
        self._cache: OrderedDict[str, bytes] = OrderedDict()
        self._limit = cached_assets
        self._lock = threading.Lock()

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = str(environ.get("PATH_INFO", ""))
        _unmark_validators(environ)
        captured: dict[str, Any] = {}
        written: list[bytes] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], object]:
            captured.update(status=status, headers=headers, exc_info=exc_info)
            return written.append

        result = self._app(environ, capture)
        try:
            body = b"".join([*written, *result])
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        status: str = captured["status"]
        headers = list(captured["headers"])
        immutable = status.startswith("200") and (
            fingerprinted(path) or versioned_asset(path, str(environ.get("QUERY_STRING", ""))) or vendored(path)
        )
        if immutable:
            headers = [(k, v) for k, v in headers if k.lower() != "cache-control"] + [("Cache-Control", IMMUTABLE)]
        if self._compressible(status, headers, body):
            headers = _set_vary(headers)
            if accepts_gzip(environ):
                etag = next((v for k, v in headers if k.lower() == "etag"), None)
                key = path if immutable else (f"{path} {etag}" if etag is not None else None)
                body = self._gzip(key, body)
                headers = [(k, v) for k, v in headers if k.lower() not in ("content-length", "etag")]
                headers += [("Content-Encoding", "gzip"), ("Content-Length", str(len(body)))]
                if etag is not None:  # the compressed variant keeps a validator of its own (RFC 9110 8.8.3)
                    headers.append(("ETag", _gzip_tag(etag)))
        start_response(status, headers, captured["exc_info"])
        return [body]

    @staticmethod
    def _compressible(status: str, headers: list[tuple[str, str]], body: bytes) -> bool:
        if len(body) < MIN_SIZE or not status.startswith("200"):
            return False
        names = {k.lower(): v for k, v in headers}
        if "content-encoding" in names:
            return False
        return names.get("content-type", "").lower().startswith(COMPRESSIBLE)

    def _gzip(self, key: str | None, body: bytes) -> bytes:
        if key is not None:
            with self._lock:
                hit = self._cache.get(key)
                if hit is not None:
                    self._cache.move_to_end(key)
                    return hit
        packed = gzip.compress(body, compresslevel=self._level, mtime=0)
        if key is not None:
            with self._lock:
                self._cache[key] = packed
                while len(self._cache) > self._limit:
                    self._cache.popitem(last=False)
        return packed


def _gzip_tag(etag: str) -> str:
    """The entity tag of the gzipped variant: the original one with ``GZIP_TAG`` before its closing quote."""
    return f'{etag[:-1]}{GZIP_TAG}"' if etag.endswith('"') else etag


def _unmark_validators(environ: Environ) -> None:
    """A browser revalidates the gzipped variant with its tag; the app knows only its own, so take the mark off."""
    tags = environ.get("HTTP_IF_NONE_MATCH")
    if isinstance(tags, str) and GZIP_TAG in tags:
        environ["HTTP_IF_NONE_MATCH"] = tags.replace(f'{GZIP_TAG}"', '"')


def _set_vary(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    for i, (key, value) in enumerate(headers):
        if key.lower() == "vary":
            if "accept-encoding" not in value.lower():
                headers[i] = (key, f"{value}, Accept-Encoding")
            return headers
    return [*headers, ("Vary", "Accept-Encoding")]
