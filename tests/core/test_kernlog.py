"""The kernel-log parser against the shared corpus of real driver lines (every line gives the kind, address and code
its expect.json gives; no ``other`` line gives a record) and against forms and traps written here."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from gpulens.kernlog import MAX_LINE_CHARS, MAX_PENDING_LINES, SXID, XID, KernelLogParser, KernelRecord, pci_key
from tests.realdata import real_folder


def _parse(lines: list[str]) -> dict[object, list[KernelRecord]]:
    parser = KernelLogParser()
    records = [r for number, line in enumerate(lines, 1) for r in parser.feed(line, number)] + parser.flush()
    out: dict[object, list[KernelRecord]] = {}
    for r in records:
        out.setdefault(r.tag, []).append(r)
    return out


def test_every_corpus_line_gives_what_expect_json_says() -> None:
    folder = real_folder("kernel-log")
    lines = (folder / "lines.txt").read_text().splitlines()
    expected = json.loads((folder / "expect.json").read_text())
    assert len(lines) == len(expected)
    got = _parse(lines)
    for e in expected:
        records = got.get(e["line"], [])
        if e["kind"] == "other":
            assert records == [], f"line {e['line']} is not a record: {lines[e['line'] - 1]!r}"
        else:
            assert [(r.kind, r.pci_bus_id, r.code) for r in records] == [(e["kind"], e["pci_bus_id"], e["code"])], (
                f"line {e['line']}: {lines[e['line'] - 1]!r}"
            )
    kinds = Counter(r.kind for rs in got.values() for r in rs)
    assert kinds == Counter(e["kind"] for e in expected if e["kind"] != "other")
    fallen = [r.tag for rs in got.values() for r in rs if r.fallen]
    assert len(fallen) == 3  # the README: three fallen-off-the-bus messages without a number


def test_an_sxid_event_over_three_lines_counts_once() -> None:
    folder = real_folder("kernel-log")
    lines = (folder / "lines.txt").read_text().splitlines()
    expected = json.loads((folder / "expect.json").read_text())
    got = _parse(lines)
    events = Counter((r.pci_bus_id, r.code) for rs in got.values() for r in rs if r.kind == SXID and not r.continuation)
    # the expectation: an SXid line right after one of the same address and code continues its event
    want: Counter[tuple[str, int]] = Counter()
    previous = None
    for e in expected:
        key = (e["pci_bus_id"], e["code"])
        if e["kind"] == SXID and key != previous:
            want[key] += 1
        previous = key if e["kind"] == SXID else None
    assert events == want
    assert max(want.values()) == 2  # a later event of the same switch and code counts again


ADDRESS = "0000:3b:00"


@pytest.mark.parametrize(
    "line",
    [
        "[ 12.345678] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.",
        "[Mon Dec  7 11:00:00 2026] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.",
        "kern  :warn  : 2026-12-07T11:00:00,000000+00:00 NVRM: Xid (PCI:0000:3b:00): 79, x",
        "Dec  7 11:00:00 host kernel: [   12.3] NVRM: Xid (PCI:0000:3B:00): 79, x",
        "Dec  7 11:00:00 kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",
        "kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",
        "NVRM: Xid (PCI:0000:3b:00): 79, x",
        "4,10,12345,-;NVRM: Xid (PCI:0000:3b:00): 79, x",
        "NVRM: Xid (PCI:0000:3b:00 GPU-I:03): 79, x",
        "NVRM: Xid (0000:3b:00): 79, x",
    ],
)
def test_every_form_of_an_xid_line(line: str) -> None:
    assert _parse([line]) == {1: [KernelRecord(XID, ADDRESS, 79, 1)]}


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:dc:00) 45 caused by previous Xid 149",
        "NVRM: GPU3 notified its channels after critical error 79.",
        "NVRM: _kgspLogXid119: ***** GSP Timeout *****",
        "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
        "nvidia-nvswitch5: open (major=507)",
        "nvidia 0000:3b:00.0: enabling device (0000 -> 0003)",
        "NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:2330) installed in this system is not supported",
        "",
        "x" * 10_000,
    ],
)
def test_traps_give_no_record(line: str) -> None:
    assert _parse([line, "[ 1.0] unrelated"]) == {}


def test_the_multi_line_fallen_off_message_is_held_until_it_ends() -> None:
    lines = [
        "[ 1.0] NVRM: The NVIDIA GPU 0001:3b:00.0",
        "               NVRM: (PCI ID: 10de:2335) installed in this system has",
        "               NVRM: fallen off the bus and answers no more.",
    ]
    parser = KernelLogParser()
    assert [parser.feed(line, n) for n, line in enumerate(lines, 1)] == [[], [], []]
    assert parser.feed("[ 2.0] next", 4) == [KernelRecord(XID, "0001:3b:00", 79, 1, fallen=True)]
    assert parser.flush() == []


def test_pending_state_is_bounded() -> None:
    parser = KernelLogParser()
    parser.feed("NVRM: The NVIDIA GPU 0000:3b:00.0", 1)
    for _ in range(100_000):  # endless continuation lines: at most MAX_PENDING_LINES are held
        parser.feed("               NVRM: " + "y" * (3 * MAX_LINE_CHARS))
    assert parser._pending is None
    huge = "NVRM: Xid (PCI:0000:3b:00): 13, " + "z" * 10_000_000
    assert _parse([huge]) == {1: [KernelRecord(XID, ADDRESS, 13, 1)]}
    assert MAX_PENDING_LINES <= 8


@pytest.mark.parametrize(
    ("given", "key"),
    [
        ("00000000:3B:00.0", "0000:3b:00"),
        ("0000:3b:00", "0000:3b:00"),
        ("3b:00.0", "0000:3b:00"),
        ("00000009:01:00.0", "0009:01:00"),
        ("00010000:01:00.0", "10000:01:00"),
        ("nonsense", None),
        ("0000:zz:00.0", None),
    ],
)
def test_pci_key_matches_nvml_and_the_driver(given: str, key: str | None) -> None:
    assert pci_key(given) == key
