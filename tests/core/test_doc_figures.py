"""Every measured figure quoted in docs/ is BENCHMARKS.md's, or says when it was measured.

A *figure* is a number, or a range of two ("0.91-1.01", "12.7 to 14.8"), followed by a unit that measurements use
and settings seldom do: ms, µs, CPU-s, "% of a core", rows/s, bytes a row ("bytes a GPU row", "B a value"); and,
with a decimal point only, a ratio ("0.90 x"), a time ("1.10 s") and a size (KiB/MiB/GiB/kB/MB/GB, not per second:
a whole number of those is a capacity, a limit or a page size far more often than a measurement, and a rate a
ceiling). Settings and thresholds stay out by that choice of units, and because text in code spans and code blocks
is not read: write a setting as code (`--interval 180`, `work_mem = 64MB`).

A figure passes when BENCHMARKS.md gives each of its numbers in the same unit (``benchmark_figures``), or when its
paragraph, list item or table row carries a date: ``YYYY-MM-DD``, or "measured <Month> <YYYY>". A table row or a
list item is also dated by the paragraph just above its table or list. A date proves nothing; it tells the reader
how old the figure is, and BENCHMARKS.md has the latest ones."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]
BENCHMARKS: Final = ROOT / "BENCHMARKS.md"

_NUM: Final = r"\d[\d,]*(?:\.\d+)?"
_DEC: Final = r"\d[\d,]*\.\d+"
_RANGE_SEP: Final = r"\s*(?:-|\u2013|to)\s*"
RATIO: Final = "ratio"
# a unit's pattern -> its kind (None: the unit as written)
UNITS: Final[dict[str, str | None]] = {
    r"ms\b": "ms",
    r"(?:µs|us)\b": "us",
    r"CPU-s\b": "CPU-s",
    r"% of (?:a|one) core\b": "% of a core",
    r"rows/s\b": "rows/s",
    r"(?:bytes|B) (?:a|per) (?:GPU |port |host )?(?:row|value|sample)\b": "bytes a row",
}
DECIMAL_UNITS: Final[dict[str, str | None]] = {
    r"(?:KiB|MiB|GiB|kB|MB|GB)\b(?!/)": None,
    r"(?:x|\u00d7)(?![\w/])": RATIO,
    r"s\b(?![/-])": "s",
}
_FIGURES: Final = [
    (re.compile(f"(?<![\\w.,])({number})(?:{_RANGE_SEP}({number}))?\\s?({unit})"), kind)
    for units, number in ((UNITS, _NUM), (DECIMAL_UNITS, _DEC))
    for unit, kind in units.items()
]
_MONTHS: Final = "January|February|March|April|May|June|July|August|September|October|November|December"
_DATE: Final = re.compile(rf"\b20\d\d-[01]\d-[0-3]\d\b|\bmeasured (?:in )?(?:{_MONTHS}) 20\d\d\b")
_CODE_SPAN: Final = re.compile(r"`[^`]*`")
_LINK_TARGET: Final = re.compile(r"\]\([^)]*\)")
_LIST_ITEM: Final = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")
_NUMBER: Final = re.compile(_NUM)
_SHARED_UNIT: Final = re.compile(rf"({_NUM}) / ({_NUM}) ([^\s\d/;|()]+)")
_PERCENT: Final = re.compile(rf"({_NUM})(?:{_RANGE_SEP}({_NUM}))?\s?%")


@dataclass(frozen=True)
class Figure:
    line: int  # 1-based
    text: str  # as written
    numbers: tuple[str, ...]  # without thousands separators
    unit: str
    kind: str  # the unit, with its spellings made one ("% of one core": "% of a core")


def _plain(line: str) -> str:
    """The line without code spans and link targets (a figure is prose)."""
    return _LINK_TARGET.sub("]", _CODE_SPAN.sub(" ", line))


def figures(line: str, number: int = 0) -> list[Figure]:
    """The measured figures on one line of prose, in order."""
    plain = _plain(line)
    found = []
    for pattern, kind in _FIGURES:
        for match in pattern.finditer(plain):
            low, high, unit = match.groups()
            numbers = tuple(n.replace(",", "") for n in (low, high) if n is not None)
            found.append((match.start(), Figure(number, match.group(0), numbers, unit, unit if kind is None else kind)))
    return [figure for _, figure in sorted(found, key=lambda pair: pair[0])]


def benchmark_figures(text: str) -> set[tuple[str, str]]:
    """BENCHMARKS.md's figures as (number, kind). Besides the figures as the docs write them ("0.24 / 2.8 ms" as two
    figures in ms): every number of a table
    row whose first cell is about bytes is a number of bytes a row, every number before a "%" on a line about a core
    a share of a core, and every number anywhere a ratio (BENCHMARKS.md gives ratios bare, in their own column)."""
    found: set[tuple[str, str]] = set()
    for line in text.splitlines():
        while (shared := _SHARED_UNIT.sub(r"\1 \3 / \2 \3", line)) != line:  # "0.24 / 2.8 ms": both in ms
            line = shared
        found |= {(n, f.kind) for f in figures(line) for n in f.numbers}
        numbers = [n.replace(",", "") for n in _NUMBER.findall(_plain(line))]
        found |= {(n, RATIO) for n in numbers}
        if line.startswith("|") and "bytes" in line.split("|")[1]:
            found |= {(n, "bytes a row") for n in numbers}
        if "core" in line:
            shares = [n for match in _PERCENT.finditer(_plain(line)) for n in match.groups() if n is not None]
            found |= {(n.replace(",", ""), "% of a core") for n in shares}
    return found


def in_benchmarks(figure: Figure, benchmarks: set[tuple[str, str]]) -> bool:
    return all((n, figure.kind) in benchmarks for n in figure.numbers)


def _units(lines: list[str]) -> list[tuple[list[int], list[int]]]:
    """Each paragraph, list item and table row outside code blocks, as (the lines that may date it, its own lines):
    a table row is dated by itself or by the paragraph just above its table, a list item likewise by itself or by
    the paragraph just above its list."""
    units: list[tuple[list[int], list[int]]] = []
    current: list[int] = []
    item = False  # current is a list item
    in_list = False
    above: list[int] = []  # the last unit closed, while nothing but blank lines followed it
    caption: list[int] = []  # the current table's or list's
    fenced = False

    def close() -> None:
        nonlocal current, above
        if current:
            units.append(([*caption, *current] if item else current, current))
            above = current
        current = []

    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("```"):
            close()
            fenced, above, in_list = not fenced, [], False
        elif fenced:
            continue
        elif stripped.startswith("|"):
            if not (i > 0 and lines[i - 1].strip().startswith("|")):  # a table starts
                caption = current or above
            close()
            units.append(([*caption, i], [i]))
            above, in_list = [], False
        elif not stripped:
            close()
        elif stripped.startswith("#"):
            close()
            above, in_list = [], False
        elif _LIST_ITEM.match(line):
            if not in_list:
                caption = [] if item else (current or above)
            close()
            current, item, in_list = [i], True, True
        else:
            if not current and not line[0].isspace():  # a paragraph starts (after a list, it ends the list)
                in_list, item = False, False
            current.append(i)
    close()
    return units


def undated_unknown_figures(doc: str, benchmarks: str, name: str = "doc") -> list[str]:
    """``name:line: figure`` for each figure of ``doc`` neither in ``benchmarks`` nor dated."""
    lines = doc.splitlines()
    bench = benchmark_figures(benchmarks)
    failures = []
    for dating, own in _units(lines):
        if _DATE.search(" ".join(_plain(lines[i]) for i in dating)):
            continue
        for i in own:
            failures += [f"{name}:{i + 1}: {f.text}" for f in figures(lines[i], i + 1) if not in_benchmarks(f, bench)]
    return failures


# ------------------------------------------------------------------------------------------------ the checker


BENCH = """| what | gpulens |
|---|---|
| one collection cycle (p50), 8 GPUs | 27 ms |
| recording rules, CPU per evaluation; share of a core | 8.1 CPU-s; 4.4-4.5 % |
| bytes per GPU row | SQLite 99.9; PostgreSQL 173.8-193.3 |
| CPU against Prometheus | 0.90 x |
"""


def test_a_figure_is_a_number_and_a_measurement_unit() -> None:
    line = "A cycle takes 27 ms, 0.91-1.01 s a round, 12.7 to 14.8 CPU-s, 4.5 % of a core, 173.8 bytes a GPU row."
    assert [(f.numbers, f.unit) for f in figures(line)] == [
        (("27",), "ms"),
        (("0.91", "1.01"), "s"),
        (("12.7", "14.8"), "CPU-s"),
        (("4.5",), "% of a core"),
        (("173.8",), "bytes a GPU row"),
    ]
    assert [f.numbers for f in figures("0.90 x its scraping; 91,300 rows/s; 17.7 KiB")] == [
        ("0.90",),
        ("91300",),
        ("17.7",),
    ]


def test_settings_thresholds_and_ceilings_are_not_figures() -> None:
    prose = (
        "Every 180 s, a `timeout` of `10s`, `work_mem = 64MB`, 90% of the link, NDR at 50 GB/s, 1,000 x 8 GPUs, "
        "from 2 to 10 s, [link](BENCHMARKS.md#1.5-s)."
    )
    assert figures(prose) == []


def test_an_undated_figure_that_benchmarks_lacks_fails_with_its_file_and_line() -> None:
    doc = "# Title\n\nThe exporter takes 0.42 % of a core at 1 s.\nA rule takes 8.1 s (the bench's 8.1 is CPU-s).\n"
    failures = undated_unknown_figures(doc, BENCH, "docs/x.md")
    assert failures == ["docs/x.md:3: 0.42 % of a core", "docs/x.md:4: 8.1 s"]


def test_a_figure_passes_when_benchmarks_has_it_or_its_paragraph_row_or_table_is_dated() -> None:
    doc = """A cycle takes 27 ms; the rules 8.1 CPU-s, 4.5 % of a core; a row 99.9 bytes a GPU row, at 0.90 x.

Measured on 2026-12-04: 3.3 ms a call,
continued over 2.2 s.

## Items

- an item measured November 2026: 5.5 ms
- another item: 6.6 ms

On 2026-12-02, two more:

- 10.1 ms
- 10.2 ms

| what | time |
|---|---|
| a row dated 2026-12-01 | 7.7 ms |
| an undated row | 8.8 ms |

On 2026-12-05, the same machine:

| what | time |
|---|---|
| dated by its caption | 9.9 ms |

```
11.1 ms in a code block
```
"""
    assert undated_unknown_figures(doc, BENCH, "x.md") == ["x.md:9: 6.6 ms", "x.md:19: 8.8 ms"]


# ------------------------------------------------------------------------------------------------ the docs


# Pages not checked: each has undated figures, and its entry goes with the last of them (the test below fails once
# a page listed here passes).
UNCHECKED: Final = frozenset[str]()


def _failures(path: Path) -> list[str]:
    benchmarks = BENCHMARKS.read_text(encoding="utf-8")
    return undated_unknown_figures(path.read_text(encoding="utf-8"), benchmarks, f"docs/{path.name}")


def test_every_figure_in_the_docs_is_in_benchmarks_or_dated() -> None:
    failures = [
        f for path in sorted((ROOT / "docs").glob("*.md")) if path.name not in UNCHECKED for f in _failures(path)
    ]
    assert not failures, "figures neither in BENCHMARKS.md nor dated:\n" + "\n".join(failures)


def test_the_pages_left_unchecked_still_need_to_be() -> None:
    assert [name for name in sorted(UNCHECKED) if not _failures(ROOT / "docs" / name)] == []


def test_the_migration_table_lists_every_revision() -> None:
    storage = (ROOT / "docs" / "storage.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"^\| (\d{4})(?:, (\d{4}))? \|", storage, re.MULTILINE))
    documented = {n for pair in listed for n in pair if n}
    revisions = {p.name[1:5] for p in (ROOT / "storage" / "migrations" / "versions").glob("v[0-9][0-9][0-9][0-9]_*.py")}
    assert revisions - documented == set()
