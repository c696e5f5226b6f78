"""The one host:port parser."""

from __future__ import annotations

import pytest

from gpulens.netaddr import parse_listen


@pytest.mark.parametrize(
    ("text", "expected"), [("0.0.0.0:9410", ("0.0.0.0", 9410)), (":9410", ("0.0.0.0", 9410)), ("[::1]:80", ("::1", 80))]
)
def test_parse_listen(text, expected) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["9410", "host:", "host:99999", "host:http"])
def test_parse_listen_rejects(text) -> None:
    with pytest.raises(ValueError, match="host:port"):
        parse_listen(text)
