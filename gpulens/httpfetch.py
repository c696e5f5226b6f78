"""The HTTP client of gpulens: one deadline for a whole request, a size cap on its body, no redirects; URL redaction.

Every HTTP request gpulens makes (dcgm-exporter pages, notifications, collector scrapes) is bounded in time and
size here:

* **One deadline per request** (``Deadline``). Connecting, sending and every read of the status line, headers and
  body get a socket timeout of the time *left*, and a read is never started after the deadline. A server that
  drips one byte a second therefore fails at the deadline, not after one timeout per read.
  ``DeadlineHTTPConnection``/``DeadlineHTTPSConnection`` do this for ``http.client`` (a keep-alive pool sets
  ``conn.deadline`` before each request); ``request`` does it for one urllib request.
* **A size cap** (``read_body``): a declared ``Content-Length`` over the cap is refused before reading; the body,
  and a gzip body once unzipped, are read in bounded chunks and refused once over the cap (or cut at the cap where
  the caller only wants the start of it).
* **No redirects**: a redirect would carry the request, and its credentials, elsewhere; it is answered as its status.
* **Redaction**: ``redact_url`` for HTTP and database URLs in messages and logs, ``redact_secret_url`` for a URL
  that is itself a secret (a Slack webhook), ``scrub`` for error texts that may quote a secret.

Credentials in a fetched URL (``user:pass@``) are sent as Basic auth and never appear in an error message.
"""

from __future__ import annotations

import base64
import contextlib
import io
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.message import Message
from http.client import HTTPConnection, HTTPException, HTTPResponse, HTTPSConnection
from typing import IO, Any, Final
from urllib.parse import parse_qsl, unquote, urlsplit

from gpulens.model import SourceError

Fetch = Callable[[str, float], bytes]
CHUNK: Final = 64 * 1024  # the most read from a socket at once

# --- redaction -----------------------------------------------------------------------------------------------------

_SECRET_QUERY: Final = re.compile(
    r"(?i)([?&;](?:password|passwd|pwd|token|access_token|secret|api_key|apikey|sig|signature)=)([^&;#]*)"
)
_HIDDEN_QUERY_VALUE: Final = "%2A%2A%2A"  # "***", percent-encoded as in a query


def redact_url(url: str) -> str:
    """``url`` safe for messages and logs, even when it is malformed.

    In an http(s) URL the whole ``user:password@`` becomes ``***@``: Basic-auth user names are often tokens. In
    any other URL (a database's) the user name stays and the password becomes ``***``. Query values of
    password/token/secret keys become ``%2A%2A%2A`` (``***``).
    """
    url = _SECRET_QUERY.sub(lambda m: m.group(1) + _HIDDEN_QUERY_VALUE, url)
    start = url.find("://")
    at = url.rfind("@")
    if start < 0 or at < start:
        return url
    authority = start + 3
    if url[:start].lower() in ("http", "https"):
        return url[:authority] + "***" + url[at:]
    user, colon, _ = url[authority:at].partition(":")
    return url[:authority] + user + (":***" if colon else "") + url[at:]


def redact_secret_url(url: str) -> str:
    """``https://hooks.slack.com/***``: scheme, host and port only, for a URL whose path or query is a secret."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "***"
    return f"{parts.scheme or '?'}://{host}{port}/***"


_MIN_SECRET_PIECE = 6  # shorter pieces of a secret URL ("api", "v1") are too common to hide without mangling text


def secret_pieces(secret: str) -> list[str]:
    """A secret and, if it is a URL, every part a receiver might echo alone: its path, each path segment, its
    query, each query value, its userinfo, user and password. Longest first, so a piece never hides inside another."""
    pieces = {secret}
    try:
        parts = urlsplit(secret)
    except ValueError:
        return [secret]
    userinfo = parts.netloc.rpartition("@")[0]
    pieces |= {parts.path, parts.query, userinfo, *userinfo.split(":", 1)}
    pieces |= {unquote(segment) for segment in parts.path.split("/")} | set(parts.path.split("/"))
    pieces |= {value for _, value in parse_qsl(parts.query, keep_blank_values=True)}
    return sorted((p for p in pieces if len(p) >= _MIN_SECRET_PIECE or p == secret), key=len, reverse=True)


def scrub(text: str, *secrets: str) -> str:
    """``text`` with every secret, and every piece of a secret URL (path segment, query value, userinfo), replaced
    by ``***``: a receiver that echoes only its token back must not get it into a log or an error."""
    for secret in secrets:
        if not secret:
            continue
        for piece in secret_pieces(secret):
            text = text.replace(piece, "***")
    return text


def check_url(url: str, example: str = "http://host:9400/metrics") -> None:
    """Raise ``ValueError`` unless ``url`` is an http(s) URL with a host."""
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port is None or parts.port > 0)
    except ValueError:  # a bad port or IPv6 literal
        valid = False
    if not valid:
        raise ValueError(f"URL must look like {example}, not {redact_url(url)!r}")


# --- the deadline --------------------------------------------------------------------------------------------------


class Deadline:
    """The moment a request must be over by (monotonic clock), and a way to end it sooner.

    Connections using it attach their sockets; ``cancel()`` (from any thread) shuts them down, so a blocked read
    returns at once and the request fails with ``TimeoutError``. ``abort_requests(thread)`` cancels the request that
    ``request()`` is running on that thread (a worker being stopped).
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.cancelled = False

    def remaining(self) -> float:
        """Seconds left; raises ``TimeoutError`` once none are, or once cancelled."""
        left = self._end - time.monotonic()
        if left <= 0 or self.cancelled:
            raise TimeoutError(f"timed out after {self.seconds:g} s" if not self.cancelled else "cancelled")
        return left

    def attach(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            if self.cancelled:
                _shutdown(sock)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            for sock in self._sockets:
                _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


_running_lock = threading.Lock()
_running: dict[int, Deadline] = {}  # thread ident -> the deadline of the request() running on it


def abort_requests(thread: threading.Thread) -> None:
    """Cut short the ``request()`` running on ``thread``, if any: it raises ``TimeoutError`` at once."""
    with _running_lock:
        deadline = _running.get(thread.ident or -1)
    if deadline is not None:
        deadline.cancel()


class _DeadlineReader(io.RawIOBase):
    """A socket's reader that sets the socket's timeout to the time left before each read of at most ``CHUNK``."""

    def __init__(self, raw: Any, sock: socket.socket, deadline: Deadline) -> None:
        super().__init__()
        self._raw = raw  # the socket's own SocketIO: it keeps the socket open while this reader is
        self._sock = sock
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(self._deadline.remaining())
        with memoryview(buffer) as view:
            count: int = self._raw.readinto(view[:CHUNK])
        return count

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class DeadlineHTTPConnection(HTTPConnection):
    """An ``http.client`` connection whose every connect, send and read ends by ``deadline`` (None: no deadline).

    Set ``deadline`` before each request on a kept-alive connection.
    """

    def __init__(self, *args: Any, deadline: Deadline | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline
        self.response_class = self._response  # type: ignore[assignment]

    def connect(self) -> None:
        if self.deadline is not None:
            self.timeout = self.deadline.remaining()
        super().connect()
        if self.deadline is not None:
            self.deadline.attach(self.sock)

    def send(self, data: Any) -> None:
        if self.sock is None and self.auto_open:
            self.connect()
        if self.deadline is not None and self.sock is not None:
            self.sock.settimeout(self.deadline.remaining())
        super().send(data)

    def _response(self, sock: socket.socket, *args: Any, **kwargs: Any) -> HTTPResponse:
        response = HTTPResponse(sock, *args, **kwargs)
        if self.deadline is not None:
            raw = response.fp.detach()
            response.fp = io.BufferedReader(_DeadlineReader(raw, sock, self.deadline), CHUNK)
        return response


class DeadlineHTTPSConnection(DeadlineHTTPConnection, HTTPSConnection):
    """``DeadlineHTTPConnection`` over TLS (takes ``context=`` like ``http.client.HTTPSConnection``)."""


class _DeadlineHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(self._connection, req)

    def _connection(self, *args: Any, **kwargs: Any) -> DeadlineHTTPConnection:
        return DeadlineHTTPConnection(*args, deadline=self._deadline, **kwargs)


class _DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self._deadline = deadline
        self._tls = context

    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(self._connection, req, context=self._tls)

    def _connection(self, *args: Any, **kwargs: Any) -> DeadlineHTTPSConnection:
        return DeadlineHTTPSConnection(*args, deadline=self._deadline, **kwargs)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are refused: they would carry the request (and its credentials) to another place."""

    def redirect_request(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: Message, newurl: str
    ) -> urllib.request.Request | None:
        return None


# --- the body ------------------------------------------------------------------------------------------------------


def read_body(
    response: IO[bytes], headers: Message, max_bytes: int, *, truncate: bool = False, decode: bool = True
) -> bytes:
    """The response body, read in chunks of at most ``CHUNK`` and gunzipped if ``decode`` and it is gzip.

    Over ``max_bytes`` (sent or unzipped) it raises ``ValueError``, or with ``truncate`` returns the first
    ``max_bytes`` bytes as sent. A body shorter than its ``Content-Length`` (not chunked) raises ``ValueError``.
    Time is bounded by the connection (``Deadline*Connection``), not here.
    """
    if truncate:
        chunks: list[bytes] = []
        size = 0
        while size < max_bytes and (chunk := response.read(min(CHUNK, max_bytes - size))):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    declared = headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise ValueError(f"response of {declared} bytes is larger than the limit of {max_bytes}")
    encoding = headers.get("Content-Encoding", "identity").strip().lower() if decode else "identity"
    if encoding not in ("identity", "gzip"):
        raise ValueError(f"unsupported Content-Encoding {encoding[:40]!r}")
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == "gzip" else None
    chunks = []
    received = size = 0
    while chunk := response.read(CHUNK):
        received += len(chunk)
        data = chunk if inflater is None else inflater.decompress(chunk, max_bytes + 1 - size)
        size += len(data)
        if received > max_bytes or size > max_bytes:
            raise ValueError(f"response is larger than the limit of {max_bytes} bytes")
        chunks.append(data)
    if inflater is not None and not inflater.eof:
        raise ValueError("gzip body is truncated")
    chunked = "chunked" in headers.get("Transfer-Encoding", "").lower()
    if not chunked and declared.isdigit() and received < int(declared):
        # http.client ends a length-delimited body quietly when the peer closes early: the page was cut.
        raise ValueError(f"body is truncated: {received} of {declared} bytes (Content-Length) received")
    return b"".join(chunks)


# --- requests ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: Mapping[str, str]  # names in lower case
    body: bytes


def _lower(headers: Message) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def request(
    url: str,
    *,
    timeout_s: float,
    max_bytes: int,
    method: str = "GET",
    data: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    truncate: bool = False,
    decode: bool = False,
    error_body_bytes: int = CHUNK,
    proxies: bool = False,
    context: ssl.SSLContext | None = None,
) -> HttpResponse:
    """One HTTP(S) request, over by ``timeout_s`` from now, no redirects; any status is returned, not raised.

    The body is read by ``read_body(max_bytes, truncate=, decode=)``; an error status's body only up to
    ``error_body_bytes`` (0: not read). ``proxies``: use the environment's proxy settings. Raises ``TimeoutError``
    at the deadline, ``urllib.error.URLError``/``OSError``/``HTTPException`` when the transport fails,
    ``ValueError`` for a body over the limit or a URL that is not http(s).
    """
    if urlsplit(url).scheme not in ("http", "https"):
        raise ValueError("only http and https URLs can be requested")
    deadline = Deadline(timeout_s)
    handlers: list[urllib.request.BaseHandler] = [
        _DeadlineHTTPHandler(deadline),
        _DeadlineHTTPSHandler(deadline, context),
        _NoRedirect(),
    ]
    if not proxies:
        handlers.append(urllib.request.ProxyHandler({}))
    opener = urllib.request.build_opener(*handlers)
    req = urllib.request.Request(url, data=data, headers=dict(headers or {}), method=method)  # noqa: S310
    ident = threading.get_ident()
    with _running_lock:
        _running[ident] = deadline
    try:
        with opener.open(req, timeout=timeout_s) as response:
            body = read_body(response, response.headers, max_bytes, truncate=truncate, decode=decode)
            return HttpResponse(response.status, _lower(response.headers), body)
    except urllib.error.HTTPError as exc:
        with exc:
            readable = exc.fp is not None and error_body_bytes > 0
            body = read_body(exc, exc.headers, error_body_bytes, truncate=True) if readable else b""
            return HttpResponse(exc.code, _lower(exc.headers or Message()), body)
    except (OSError, HTTPException):
        if deadline.cancelled:
            raise TimeoutError("cancelled") from None
        raise
    finally:
        with _running_lock:
            if _running.get(ident) is deadline:
                del _running[ident]


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
    """GET ``url`` within ``timeout_s`` in all (gzip accepted, no proxy, no redirects, ``user:pass@`` as Basic auth).

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
    try:
        response = request(
            target,
            timeout_s=timeout_s,
            max_bytes=max_bytes,
            headers=request_headers,
            decode=True,
            error_body_bytes=0,
            context=context,
        )
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
    else:
        if 200 <= response.status < 300:
            return response.body
        problem = f"answered HTTP {response.status}"
    for secret in secrets:
        problem = problem.replace(secret, "***")
    raise SourceError(f"{what} at {safe} {problem}")
