"""A dcgm-exporter with its default counters (no clock-event reasons, no power limit, no maximum clock) scraped over
HTTP by a real collector: the throttled GPUs' reasons are inferred, stored with their source, and fire
GpuThermalThrottling, GpuPowerCapped and JobStraggler, each alert saying "inferred"."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from gpulens.alerts.config import AlertingConfig
from gpulens.alerts.rules import builtin_rules
from gpulens.alerts.service import AlertService
from gpulens.clock import ManualClock
from gpulens.collector.loop import Collector
from gpulens.model import THROTTLE_INFERRED
from gpulens.settings import TargetSettings, default_settings
from gpulens.storage import latest
from gpulens.storage.db import Database
from tests.fakes.dcgm_defaults import Gpu, default_page
from tests.fakes.dcgm_pages import fixture
from tests.fakes.dcgm_server import StandIn, stand_in_dcgm_exporter

INTERVAL_S = 10.0


@contextmanager
def collecting(tmp_path: Path, page: str) -> Iterator[tuple[Rounds, AlertService, StandIn, Database]]:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    db = Database(url)
    db.upgrade()
    service = AlertService(db, AlertingConfig(rules=tuple(builtin_rules())), notifiers={})
    settings = dataclasses.replace(
        default_settings(environ={}),
        db_url=url,
        targets=(TargetSettings(url="", name="dcgm-defaults", kind="dcgm"),),
        timeout_s=2.0,
        interval_s=INTERVAL_S,
        spool_dir=str(tmp_path / "spool"),
    )
    with stand_in_dcgm_exporter(page) as server:
        settings = dataclasses.replace(settings, targets=(dataclasses.replace(settings.targets[0], url=server.url),))
        clock = ManualClock(1_750_000_000.0)
        collector = Collector(settings, db, clock=clock, hooks=[service.hook])
        try:
            yield Rounds(collector, clock), service, server, db
        finally:
            collector.close()
            db.close()


def firing(service: AlertService) -> dict[str, dict[str, str]]:
    """Firing alerts: rule -> GPU UUID -> summary."""
    out: dict[str, dict[str, str]] = {}
    for state in service.engine.states.values():
        if state.state == "firing":
            out.setdefault(state.rule, {})[state.labels.get("uuid", "")] = state.annotations.get("summary", "")
    return out


@dataclasses.dataclass
class Rounds:
    collector: Collector
    clock: ManualClock

    def __call__(self, n: int) -> None:
        """Run ``n`` collector rounds, one interval apart."""
        for _ in range(n):
            self.collector.run_round()
            self.clock.advance(INTERVAL_S)


@pytest.mark.parametrize("current_names", [False, True], ids=["default-names", "dcgm46-names"])
def test_a_default_counters_page_fires_thermal_and_power_alerts_said_inferred(
    tmp_path: Path, current_names: bool
) -> None:
    hot, capped, healthy = Gpu(0, sm_mhz=1395, temp=89, power=521.4), Gpu(1, sm_mhz=1710, temp=71, power=698.2), Gpu(2)
    page = default_page([hot, capped, healthy], current_names=current_names)
    if not current_names:
        assert page == fixture("default_counters_h100.prom")
    with collecting(tmp_path, page) as (rounds, service, _, db):
        rounds(8)  # GpuThermalThrottling holds for 1 minute
        alerts = firing(service)
        assert set(alerts.get("GpuThermalThrottling", {})) == {hot.uuid}
        assert "sw_thermal, inferred from SM clock, temperature and power" in alerts["GpuThermalThrottling"][hot.uuid]
        assert "GpuPowerCapped" not in alerts  # it holds for 5 minutes
        rounds(24)
        alerts = firing(service)
        assert set(alerts.get("GpuPowerCapped", {})) == {capped.uuid}
        assert "700 W power limit (sw_power_cap, inferred from SM clock" in alerts["GpuPowerCapped"][capped.uuid]
        assert set(alerts["GpuThermalThrottling"]) == {hot.uuid}
        stored = {g.uuid: g for g in latest.latest_readings(db)}
        assert {u: (g.throttle_reasons, g.throttle_reasons_source) for u, g in stored.items()} == {
            hot.uuid: (0x20, THROTTLE_INFERRED),
            capped.uuid: (0x4, THROTTLE_INFERRED),
            healthy.uuid: (0, THROTTLE_INFERRED),
        }


def test_a_straggler_on_a_default_counters_page_is_named_with_its_inferred_cause(tmp_path: Path) -> None:
    """Four GPUs of one pod at full clock; then GPU 2 runs hot and slow while its peers, waiting, draw less."""
    steady = [Gpu(i, power=610.0, pod="trainer-0") for i in range(4)]
    with collecting(tmp_path, default_page(steady)) as (rounds, service, server, _):
        rounds(8)  # the job's baseline
        slow = [Gpu(i, power=500.0, pod="trainer-0") for i in range(4)]
        slow[2] = Gpu(2, sm_mhz=1395, temp=89, power=450.0, pod="trainer-0")
        server.serve(default_page(slow))
        rounds(20)  # JobStraggler holds for 3 minutes
        alerts = firing(service)
        assert set(alerts.get("JobStraggler", {})) == {slow[2].uuid}
        summary = alerts["JobStraggler"][slow[2].uuid]
        assert "job ml/trainer-0" in summary
        assert "(sw_thermal, inferred from SM clock, temperature and power" in summary
