"""The one counter-rate function: rates between two reads, None on a first read, a reset or no elapsed time."""

from __future__ import annotations

import pytest

from gpulens.counters import counter_rate


def test_rate_is_the_increase_per_second() -> None:
    assert counter_rate(1000, 4000, 2.0) == 1500.0
    assert counter_rate(5, 5, 1.0) == 0.0
    assert counter_rate(1.5, 3.0, 0.5) == 3.0


@pytest.mark.parametrize(
    ("previous", "current", "elapsed"),
    [
        (None, 10, 1.0),  # first read
        (10, None, 1.0),  # the counter could not be read now
        (10, 20, None),
        (10, 20, 0.0),  # the clock did not move
        (10, 20, -1.0),  # or went backwards
        (20, 10, 1.0),  # reset: the counter restarted
    ],
)
def test_rate_is_unknown(previous: float | None, current: float | None, elapsed: float | None) -> None:
    assert counter_rate(previous, current, elapsed) is None
