"""HTTP GET for scrapes: gzip, a size limit (also on the unzipped body), a deadline, no proxies, no redirects.

Credentials in a URL (``user:pass@``) are sent as Basic auth and never appear in an error message.
"""

from __future__ import annotations

import base64
import ssl
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Mapping
from email.message import Message
from http.client import HTTPException
from typing import IO, Final
from urllib.parse import unquote, urlsplit

from gpulens.model import SourceError

Fetch = Callable[[str, float], bytes]
_CHUNK: Final = 64 * 1024


def redact_url(url: str) -> str:
    """The URL with any ``user:password@`` replaced by ``***@``, for messages and logs."""
    start = url.find("//")
    at = url.rfind("@")
    if start < 0 or at < start:
        return url
    return url[: start + 2] + "***" + url[at:]


def check_url(url: str, example: str = "http://host:9400/metrics") -> None:
    """Raise ``ValueError`` unless ``url`` is an http(s) URL with a host."""
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port is None or parts.port > 0)
    except ValueError:  # a bad port or IPv6 literal
        valid = False
    if not valid:
        raise ValueError(f"URL must look like {example}, not {redact_url(url)!r}")


def _split_credentials(url: str) -> tuple[str, str | None, tuple[str, ...]]:
    """The URL without userinfo, its Basic ``Authorization`` header if any, and the secrets to scrub from messages."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None, ()
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode("ascii")
    secrets = tuple(secret for secret in {password, unquote(password)} if secret)
    return parts._replace(netloc=host).geturl(), "Basic " + token, secrets


def _reason_text(reason: object) -> str:
    if isinstance(reason, TimeoutError):
        return "timed out"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    return str(reason) or type(reason).__name__


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are refused: they would carry the Authorization header to another place."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> urllib.request.Request | None:
        return None


def _read_body(response: IO[bytes], headers: Message, max_bytes: int, deadline: float) -> bytes:
    """The response body, gunzipped if needed; raises ``ValueError`` with a reason when it cannot be had."""
    declared = headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise ValueError(f"response of {declared} bytes is larger than the limit of {max_bytes}")
    encoding = headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("identity", "gzip"):
        raise ValueError(f"unsupported Content-Encoding {encoding[:40]!r}")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == "gzip" else None
    chunks: list[bytes] = []
    received = size = 0
    while chunk := response.read(_CHUNK):
        if time.monotonic() > deadline:
            raise TimeoutError
        received += len(chunk)
        data = chunk if inflater is None else inflater.decompress(chunk, max_bytes + 1 - size)
        size += len(data)
        if received > max_bytes or size > max_bytes:
            raise ValueError(f"response is larger than the limit of {max_bytes} bytes")
        chunks.append(data)
    if inflater is not None and not inflater.eof:
        raise ValueError("gzip body is truncated")
    return b"".join(chunks)


def fetch_url(
    url: str,
    timeout_s: float,
    *,
    max_bytes: int,
    what: str = "dcgm-exporter",
    accept: str = "text/plain",
    headers: Mapping[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> bytes:
    """GET ``url`` (gzip accepted, no proxy, no redirects, ``user:pass@`` sent as Basic auth).

    Raises ``SourceError`` naming ``what`` and the redacted URL; the message never holds the URL's credentials.
    """
    safe = redact_url(url)
    try:
        check_url(url)
    except ValueError as exc:
        raise SourceError(str(exc)) from None
    target, authorization, secrets = _split_credentials(url)
    request_headers = {"Accept": accept, "Accept-Encoding": "gzip", "User-Agent": "gpulens", **(headers or {})}
    if authorization:
        request_headers["Authorization"] = authorization
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({}), _NoRedirect()]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    opener = urllib.request.build_opener(*handlers)
    deadline = time.monotonic() + timeout_s
    try:
        request = urllib.request.Request(target, headers=request_headers)  # noqa: S310  (scheme checked above)
        with opener.open(request, timeout=timeout_s) as response:
            return _read_body(response, response.headers, max_bytes, deadline)
    except urllib.error.HTTPError as exc:
        exc.close()
        problem = f"answered HTTP {exc.code}"
    except urllib.error.URLError as exc:
        problem = f"cannot be reached: {_reason_text(exc.reason)}"
    except TimeoutError:
        problem = f"timed out after {timeout_s:g} s"
    except zlib.error:
        problem = "sent a corrupt gzip body"
    except ValueError as exc:
        problem = str(exc)
    except (OSError, HTTPException) as exc:
        problem = f"failed: {_reason_text(exc)}"
    for secret in secrets:
        problem = problem.replace(secret, "***")
    raise SourceError(f"{what} at {safe} {problem}")
