from __future__ import annotations

from pathlib import Path

from gpulens.exporter.fabricmetrics import HOST_GAUGES, JOB_GAUGES, NIC_COUNTERS
from gpulens.exporter.metrics import ExporterHealth, render_metrics
from gpulens.exporter.reference import _full_snapshot, metrics_reference
from tests.exporter.test_metrics import CONTRACT_FAMILIES, promtool_check

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_metrics_reference_is_current() -> None:
    assert DOC.read_text() == metrics_reference(), "regenerate: python -m gpulens.exporter.reference > docs/metrics.md"


def test_reference_lists_every_contract_family() -> None:
    text = metrics_reference()
    for family in CONTRACT_FAMILIES:
        assert f"`{family}" in text, family


def fabric_family_names() -> list[str]:
    fixed = ["gpulens_nic_info", "gpulens_nic_up", "gpulens_nic_link_speed_bytes_per_second", "gpulens_nic_link_width"]
    fixed += ["gpulens_nic_saturated", "gpulens_job_cpu_seconds_total"]
    return fixed + [name for _, name, _ in (*NIC_COUNTERS, *HOST_GAUGES, *JOB_GAUGES)]


def test_reference_documents_every_fabric_family() -> None:
    text = DOC.read_text()
    for family in fabric_family_names():
        assert f"| `{family}` |" in text, family


def test_every_family_of_the_reference_snapshot_is_promtool_clean(promtool: str) -> None:
    body = render_metrics(_full_snapshot(), ExporterHealth(0.0, 0.0, {"reason": 1}))
    rendered = {line.split()[2] for line in body.decode().splitlines() if line.startswith("# TYPE ")}
    assert set(fabric_family_names()) <= rendered
    result = promtool_check(promtool, body)
    assert result.returncode == 0, result.stdout + result.stderr
