"""Formatting: how values read for a person, and the rounding that keeps figure JSON small."""

from __future__ import annotations

import pytest

from gpulens.dashboard.formatting import (
    MISSING,
    bytes_text,
    duration_text,
    percent_text,
    rate_text,
    round_sig,
    watts_text,
)
from tests.dashboard.test_figures import GIB


@pytest.mark.parametrize(
    ("value", "digits", "expected"),
    [(0.123456, 4, 0.1235), (123456.0, 2, 120000.0), (0.0, 4, 0.0), (-0.0098765, 3, -0.00988), (None, 4, None)],
)
def test_round_sig(value: float | None, digits: int, expected: float | None) -> None:
    assert round_sig(value, digits) == expected


def test_round_sig_drops_non_finite() -> None:
    assert round_sig(float("nan")) is None
    assert round_sig(float("inf")) is None


def test_texts() -> None:
    assert bytes_text(79.6 * GIB) == "79.6 GiB"
    assert rate_text(62.4e9) == "62.4 GB/s"
    assert percent_text(0.987) == "99%"
    assert percent_text(None) == MISSING
    assert watts_text(12_500) == "12.5 kW"
    assert duration_text(3 * 86400 + 4 * 3600 + 5) == "3d 4h"
    assert duration_text(2 * 3600 + 5 * 60) == "2h 05m"
    assert duration_text(40) == "40s"
