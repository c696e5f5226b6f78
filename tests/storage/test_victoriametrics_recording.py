"""The recording rules over a real VictoriaMetrics, evaluated by a real vmalert (both from Debian's
``victoria-metrics``): the shipped rule file passes vmalert's check (MetricsQL parses every expression); replayed
over a simulated cluster's imported history (``vmalert -replay.timeFrom/-replay.timeTo``, the recorded series
written back through remote write), the reader gives the jobs and interconnect pages and the overview's headline the
raw series' data from them, and the doctor tells them present, then stale. The live path (vmalert evaluating as it
runs, VictoriaMetrics scraping) is in ``test_victoriametrics.py``.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpulens.clock import ManualClock  # now() and monotonic() both stand still
from gpulens.settings import StoreAuth
from gpulens.storage.prometheus import PromReader
from gpulens.storage.prometheus import recording as rec
from gpulens.storage.prometheus.client import PromClient
from gpulens.storage.prometheus.recorded import status
from gpulens.storage.records import JOB_POINTS
from tests.prom import replay_rules, running_victoriametrics
from tests.storage.promblocks import import_history
from tests.storage.test_prometheus_recording import check_link_outages, check_link_summary, check_node_totals, close

STEP_S = 60
SAMPLES = 31  # half an hour
NODES = 8
ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module")
def end() -> int:
    return int(time.time()) // STEP_S * STEP_S - STEP_S


@pytest.fixture(scope="module")
def store(
    tmp_path_factory: pytest.TempPathFactory, victoriametrics_bin: str, vmalert_bin: str, end: int
) -> Iterator[str]:
    """A VictoriaMetrics holding half an hour of ``NODES`` nodes, imported, and the recording rules' series over it,
    replayed by vmalert at the rules' interval."""
    work = tmp_path_factory.mktemp("vmrecorded")
    start = end - (SAMPLES - 1) * STEP_S
    rules = work / "rules.yml"
    rules.write_text(rec.rules_yaml(STEP_S, STEP_S))
    with running_victoriametrics(victoriametrics_bin, work, {}, interval_s=STEP_S) as base:
        import_history(base, NODES, start, STEP_S, SAMPLES)
        replay_rules(vmalert_bin, base, rules, start, end)
        yield base


def reader(base: str, at: float, *, use_recorded: bool = True) -> PromReader:
    return PromReader(
        "prometheus+" + base, StoreAuth(min_step_s=STEP_S), clock=ManualClock(at), use_recorded=use_recorded
    )


def test_the_shipped_file_passes_vmalert(vmalert_bin: str, tmp_path: Path) -> None:
    shipped = ROOT / "deploy" / "prometheus" / "rules" / rec.RULE_FILE
    for path in (shipped, tmp_path / "other.yml"):
        if path != shipped:
            path.write_text(rec.rules_yaml(30, 30))
        checked = subprocess.run([vmalert_bin, "-dryRun", f"-rule={path}"], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(rec.rules_yaml(30, 30).replace("sum by (job_id, user) (", "sum by (job_id, user) ((", 1))
    refused = subprocess.run([vmalert_bin, "-dryRun", f"-rule={broken}"], capture_output=True, text=True)
    assert refused.returncode != 0  # the check parses the expressions


def test_job_summaries_from_recorded_series_equal_the_raw_ones(store: str, end: int) -> None:
    at = end + 30
    start = at - 1800
    fast, slow = reader(store, at), reader(store, at, use_recorded=False)
    before = fast.client.stats.queries
    got = {j.job_id: j for j in fast.jobs(start, at)}
    queries = fast.client.stats.queries - before
    assert fast.recording.missing == {}
    want = {j.job_id: j for j in slow.jobs(start, at)}
    assert got.keys() == want.keys()
    assert len(got) >= 4
    turned = {j for j in got if j.endswith(("a", "b")) or "a-" in j or "b-" in j}
    assert turned
    for job, mine in got.items():
        theirs = want[job]
        assert (mine.gpus, mine.nodes, mine.user) == (theirs.gpus, theirs.nodes, theirs.user), job
        step = 1800 / JOB_POINTS + 3
        assert abs(mine.gpu_hours - theirs.gpu_hours) <= len(mine.gpus) * step / 3600, job
        assert abs(mine.first_seen - theirs.first_seen) <= step
        assert abs(mine.last_seen - theirs.last_seen) <= step
        # as over Prometheus: the raw path reads a job that came or went in the range from step means
        rel = 0.02 if job in turned else 1e-9
        assert close(mine.utilization_ratio_mean, theirs.utilization_ratio_mean, rel), job
        spread = 0.25 if job in turned else 1e-6
        assert close(mine.utilization_ratio_stddev, theirs.utilization_ratio_stddev, spread), job
        assert close(mine.memory_used_bytes_mean, theirs.memory_used_bytes_mean, rel), job
        assert mine.memory_used_bytes_max == theirs.memory_used_bytes_max, job
    assert queries <= 10  # the clock, the pairs, the GPUs per step, 6 statistics (the names are cached)


def test_port_problems_from_recorded_flags_equal_the_raw_ones(store: str, end: int) -> None:
    at = end - 30
    fast, slow = reader(store, at), reader(store, at, use_recorded=False)
    got = fast.nic_problems(at - 1800, at)
    assert fast.recording.missing == {}
    assert got == slow.nic_problems(at - 1800, at)
    assert len(got) >= NODES
    assert any(got.values())


def test_node_totals_from_recorded_series_equal_the_readings_sums(store: str, end: int) -> None:
    at = end - 30
    check_node_totals(store, at, NODES * 8)


def test_link_summary_from_recorded_loads_gives_the_raw_page(store: str, end: int) -> None:
    check_link_summary(store, end - 30)


def test_link_outages_from_recorded_flags_equal_the_raw_ones(store: str, end: int) -> None:
    check_link_outages(store, end)


def test_doctor_tells_the_replayed_series_present_then_stale(store: str, end: int) -> None:
    client = PromClient("prometheus+" + store, StoreAuth(), environ={})
    interval, states = status(client, end + 30)
    assert interval == STEP_S
    assert states == [(name, "present", 30.0) for name in rec.names()]  # each name's newest sample: the last replayed
    _, later = status(client, end + 3600)
    assert {s for _, s, _ in later} == {"stale"}
    # the recorded series cover a range only from the replay's start: a longer range reads them for that span and
    # the raw series before it (tests/storage/test_prometheus_young_rules.py compares the values)
    late = reader(store, end + 30)
    got = late.jobs(end - 3 * 3600, end + 30)
    raw = reader(store, end + 30, use_recorded=False).jobs(end - 3 * 3600, end + 30)
    assert {j.job_id for j in got} == {j.job_id for j in raw}
    assert "jobs" not in late.recording.missing
