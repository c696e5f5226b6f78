"""dcgm-exporter targets end to end: collector rounds into SQL with the alert engine hooked in, over a stand-in page.

An XID appearing on a direct scrape fires XidError; a GPU vanishing from the page is stored down and fires GpuLost;
a page with no GPU series leaves the target unhealthy with the reason; two targets claiming one node are an error.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gpulens.alerts.config import AlertingConfig
from gpulens.alerts.rules import builtin_rules
from gpulens.alerts.service import AlertService
from gpulens.clock import ManualClock
from gpulens.collector.loop import Collector
from gpulens.settings import TargetSettings, default_settings
from gpulens.storage import inventory, latest
from gpulens.storage.db import Database
from tests.dbtemplate import migrated_sqlite
from tests.fakes.dcgm_pages import GPU0, GPU1, ID0, ID1
from tests.fakes.dcgm_server import stand_in_dcgm_exporter


def page(*, xid1: int = 0, gpu1: bool = True, host: str = "gpu-node-31") -> str:
    lines = [
        f'DCGM_FI_DEV_GPU_UTIL{{{ID0},Hostname="{host}"}} 55',
        f'DCGM_FI_DEV_XID_ERRORS{{{ID0},Hostname="{host}"}} 0',
    ]
    if gpu1:
        lines += [
            f'DCGM_FI_DEV_GPU_UTIL{{{ID1},Hostname="{host}"}} 65',
            f'DCGM_FI_DEV_XID_ERRORS{{{ID1},Hostname="{host}"}} {xid1}',
        ]
    return "".join(line + "\n" for line in lines)


def settings(db_url: str, tmp_path: Path, *urls: str):  # type: ignore[no-untyped-def]
    return dataclasses.replace(
        default_settings(environ={}),
        db_url=db_url,
        targets=tuple(TargetSettings(url=u, name=f"dcgm-{i}", kind="dcgm") for i, u in enumerate(urls)),
        timeout_s=2.0,
        interval_s=10.0,
        spool_dir=str(tmp_path / "spool"),
    )


def test_an_xid_fires_xid_error_and_a_vanished_gpu_fires_gpu_lost(tmp_path: Path) -> None:
    url = migrated_sqlite(tmp_path / "g.db")
    clock = ManualClock(1_750_000_000.0)
    db = Database(url)
    service = AlertService(db, AlertingConfig(rules=tuple(builtin_rules())), notifiers={})
    with stand_in_dcgm_exporter(page()) as server:
        collector = Collector(settings(url, tmp_path, server.url), db, clock=clock, hooks=[service.hook])
        try:

            def firing() -> dict[str, set[str]]:
                out: dict[str, set[str]] = {}
                for state in service.engine.states.values():
                    if state.state == "firing":
                        out.setdefault(state.rule, set()).add(state.labels.get("uuid", ""))
                return out

            for _ in range(2):
                collector.run_round()
                clock.advance(10)
            assert "XidError" not in firing()
            server.serve(page(xid1=94))  # a contained ECC error on GPU 1: the page shows the last XID
            collector.run_round()
            clock.advance(10)
            assert firing().get("XidError") == {GPU1}
            stored = {g.uuid: g for g in latest.latest_readings(db)}
            assert stored[GPU1].xid_errors == {94: 1}

            server.serve(page(xid1=94, gpu1=False))  # GPU 1 falls off the page
            result = collector.run_round()
            clock.advance(10)
            assert firing().get("GpuLost") == {GPU1}
            assert result.rejected.get("dcgm_gpu_missing") == 1
            stored = {g.uuid: g for g in latest.latest_readings(db)}
            assert (stored[GPU0].up, stored[GPU1].up) == (True, False)
            assert stored[GPU1].node == "gpu-node-31"

            server.serve(page(xid1=94))  # it comes back
            collector.run_round()
            assert "GpuLost" not in firing()
            assert all(g.up for g in latest.latest_readings(db))
        finally:
            collector.close()
            db.close()


def test_a_page_without_gpu_series_leaves_the_target_unhealthy_with_the_reason(tmp_path: Path) -> None:
    url = migrated_sqlite(tmp_path / "g.db")
    db = Database(url)
    with stand_in_dcgm_exporter("# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 12\n") as server:
        collector = Collector(settings(url, tmp_path, server.url), db)
        try:
            result = collector.run_round()
            server.serve("")  # an empty 200 body
            empty = collector.run_round()
        finally:
            collector.close()
    (health,) = result.targets
    assert not health.up
    assert health.last_error == "no GPU series on the page (1 samples, e.g. 'go_goroutines')"
    assert empty.targets[0].last_error == "no GPU series on the page (0 samples)"
    stored = {t.target: t for t in inventory.target_health(db)}
    assert not stored["dcgm-0"].up
    db.close()


def test_two_targets_claiming_one_node_are_an_error_not_a_merge(tmp_path: Path) -> None:
    url = migrated_sqlite(tmp_path / "g.db")
    db = Database(url)
    other = page(host="gpu-node-31").replace(GPU0, "GPU-00000000-0000-4000-8000-00000000aa01")
    other = other.replace(GPU1, "GPU-00000000-0000-4000-8000-00000000aa02")
    with stand_in_dcgm_exporter(page()) as first, stand_in_dcgm_exporter(other) as second:
        collector = Collector(settings(url, tmp_path, first.url, second.url), db)
        try:
            result = collector.run_round()
        finally:
            collector.close()
    health = {t.target: t for t in result.targets}
    assert health["dcgm-0"].up
    assert not health["dcgm-1"].up
    assert health["dcgm-1"].last_error == "node gpu-node-31 is already scraped from target dcgm-0"
    assert [s.node for s in result.snapshots] == ["gpu-node-31"]
    assert {g.uuid for g in latest.latest_readings(db)} == {GPU0, GPU1}
    db.close()
