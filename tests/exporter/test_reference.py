from __future__ import annotations

from pathlib import Path

from exporter.reference import metrics_reference
from tests.exporter.test_metrics import CONTRACT_FAMILIES

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def test_metrics_reference_is_current() -> None:
    assert DOC.read_text() == metrics_reference(), "regenerate: python -m exporter.reference > docs/metrics.md"


def test_reference_lists_every_contract_family() -> None:
    text = metrics_reference()
    for family in CONTRACT_FAMILIES:
        assert f"`{family}" in text, family
