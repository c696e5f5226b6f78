"""Network addresses: the one parser of ``host:port`` listen addresses."""

from __future__ import annotations


def parse_listen(value: str) -> tuple[str, int]:
    """``host:port``, ``:port`` or ``[v6]:port`` -> (host, port); an empty host means every address.

    Raises ``ValueError`` with a one-line message naming the value.
    """
    text = value.strip()
    if text.startswith("["):
        host, sep, port = text[1:].partition("]:")
    else:
        host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected host:port with a port from 0 to 65535 (e.g. 127.0.0.1:9410), got {value!r}")
    return host or "0.0.0.0", int(port)
