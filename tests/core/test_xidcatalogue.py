"""The XID catalogue: one vocabulary of actions, the paging set the XidError rule pages on, escalation, and
docs/xid.md holding the table verbatim."""

from __future__ import annotations

from pathlib import Path

from gpulens.alerts.catalogue import PAGING_XIDS
from gpulens.xidcatalogue import (
    ACTIONS,
    HARDWARE_INSPECTION,
    PAGING_CODES,
    SXIDS,
    XIDS,
    markdown_tables,
    sxid_severity,
    xid_action,
    xid_name,
)

ROOT = Path(__file__).resolve().parents[2]


def test_the_vocabulary_is_the_contract() -> None:
    assert ACTIONS == ("none", "check-application", "reset-gpu", "reboot", "hardware-inspection")
    assert {x.action for x in XIDS} | {s.action for s in SXIDS} <= set(ACTIONS)
    assert len({x.code for x in XIDS}) == len(XIDS)
    assert len({s.code for s in SXIDS}) == len(SXIDS)


def test_the_paging_set_is_the_one_gpulens_paged_on() -> None:
    assert PAGING_CODES == (48, 62, 64, 74, 79, 94, 95, 119, 120)
    assert PAGING_XIDS == PAGING_CODES


def test_escalation() -> None:
    assert [xid_action(79, n) for n in range(4)] == ["reboot", "reboot", "reboot", HARDWARE_INSPECTION]
    assert xid_action(64, 1) == HARDWARE_INSPECTION
    assert xid_action(13, 1000) == "check-application"  # an application's fault never escalates
    assert xid_action(999) == "check-application"
    assert xid_action(999, 3) == HARDWARE_INSPECTION
    assert xid_name(999) == "not in the catalogue"
    assert (sxid_severity(20009), sxid_severity(24007), sxid_severity(99999)) == ("non-fatal", "fatal", "fatal")


def test_docs_print_the_catalogue() -> None:
    text = (ROOT / "docs" / "xid.md").read_text()
    assert markdown_tables() in text, "paste `python -m gpulens.xidcatalogue` into docs/xid.md"
    assert len(text.splitlines()) < 300
