"""Short raw ranges are read row by row (``gpulens.storage.rawseries``): the same values as the bucketed query, in one
statement that returns the range's rows and no more; long ranges still group in SQL."""

from __future__ import annotations

import pytest

from gpulens.model import NodeSnapshot
from gpulens.storage import rawseries, schema, timeseries
from gpulens.storage.db import Database
from gpulens.storage.writer import Writer
from tests.storage.conftest import T0
from tests.storage.data import snapshot, uuid_of
from tests.storage.test_query_bounds import counting

UUIDS = [uuid_of("n", 0), uuid_of("n", 1)]
FIELDS = list(schema.FIELD_BY_NAME)  # gauges, counters and the bitmask
ROUNDS = 90


TIER_ROWS = 4  # tier_state: raw, 1m, 1h and the per-job aggregate's horizon (job)


def _round(k: int) -> NodeSnapshot:
    """Round k: 10 s apart with jitter, an energy counter reset at k=50, power and a counter missing now and then
    (every 7th and 5th), throttling."""
    t = T0 + 10 * k + (k % 3) * 0.7
    energy = 1e6 + 700.0 * k if k < 50 else 700.0 * (k - 49)
    power = None if k % 7 == 0 else 300.0 + k
    replays = None if k % 5 == 0 else k * k
    return snapshot(
        "n", t, energy_joules_total=energy, power_watts=power, throttle_reasons=1 << (k % 4), pcie_replays_total=replays
    )


@pytest.fixture
def stored(db: Database) -> Database:
    Writer(db).write([_round(k) for k in range(ROUNDS)])
    return db


@pytest.mark.parametrize(
    ("offset", "seconds", "max_points"), [(0, 180, 19), (100, 300, 31), (0, 900, 1000), (40, 600, 7)]
)
def test_raw_read_equals_the_bucketed_query(
    stored: Database, monkeypatch: pytest.MonkeyPatch, offset: float, seconds: float, max_points: int
) -> None:
    """One sample per bucket (19 points over 3 min), several per bucket (7 over 10 min), a range starting after
    the counter's first samples (its lookback read), the reset and missing values: equal to the last bit."""
    start, end = T0 + offset, T0 + offset + seconds
    taken: list[int] = []
    real_rows = rawseries.rows

    def spy(*args: object, **kwargs: object) -> object:
        result = real_rows(*args, **kwargs)  # type: ignore[arg-type]
        taken.append(0 if result is None else len(result))
        return result

    monkeypatch.setattr(rawseries, "rows", spy)
    raw = timeseries.series(stored, UUIDS, FIELDS, start, end, max_points)
    assert taken
    assert taken[0] > 0  # the raw read served it
    monkeypatch.setattr(rawseries, "applies", lambda plan, ids: False)
    bucketed = timeseries.series(stored, UUIDS, FIELDS, start, end, max_points)
    assert raw == bucketed
    assert all(len(raw[u].timestamps) <= max_points for u in UUIDS)
    assert any(v is not None for v in raw[UUIDS[0]].values["energy_joules_total"])
    assert any(v is not None for v in raw[UUIDS[0]].values["pcie_replays_total"])


def test_raw_read_is_one_bounded_statement(stored: Database) -> None:
    """A 3-minute range of one GPU: the GPU's id with the tiers' state, and one read of its rows (the range's 18
    and the counter lookback's 12), never the other GPU's."""
    with counting(stored) as tally:
        data = timeseries.series(stored, UUIDS[:1], FIELDS, T0 + 200, T0 + 380, 19)
    assert len(data[UUIDS[0]].timestamps) == 18
    assert tally.statements == 2, tally.seen
    assert tally.rows <= 1 + TIER_ROWS + (180 + 120) // 10 + 1, tally.seen  # id, tier rows, samples from 2 min before


def test_long_ranges_group_in_sql(stored: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """More rows than the limit: the raw read stops at limit + 1 rows and the bucketed query answers."""
    monkeypatch.setattr(rawseries, "LOOKBACK_ROWS", 0)
    with counting(stored) as tally:
        data = timeseries.series(stored, UUIDS, ["power_watts"], T0, T0 + 900, 20)
    assert tally.statements == 3, tally.seen  # ids and tiers, the raw read cut short, the bucketed query
    assert tally.rows <= 2 + TIER_ROWS + 2 * 20 + 1 + 2 * 20
    assert len(data[UUIDS[0]].timestamps) == 20
