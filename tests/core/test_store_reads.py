"""Reads go through one interface (``gpulens.storage.reading.StoreReader``), whatever holds the data.

A read a store cannot serve raises ``NotAvailableOnBackend``: no page, alert or command asks which class its
reader is. The records and field catalogue the readers share (``storage.records``) and the interface itself import
no SQL library and no HTTP code, and the Prometheus reader imports nothing that imports SQLAlchemy.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpulens.metriccatalogue import GPU_FIELDS
from gpulens.storage import schema
from gpulens.storage.prometheus import PromReader
from gpulens.storage.reading import NotAvailableOnBackend, StoreReader
from gpulens.storage.records import FIELD_KINDS, READABLE_FIELDS, check_fields
from gpulens.storage.sqlreader import SqlReader

ROOT = Path(__file__).resolve().parents[2]
# the brief's own check, word for word: ``grep -rn "isinstance(.*Reader\|isinstance(.*Database" dashboard/ alerts/``
_GREP = re.compile(r"isinstance\(.*(Reader|Database)")


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _class_names(node: ast.expr) -> list[str]:
    """The names of the classes an ``isinstance`` call's second argument gives (a name, an attribute, a tuple)."""
    if isinstance(node, ast.Tuple):
        return [n for elt in node.elts for n in _class_names(elt)]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return []


def _is_store_class(name: str) -> bool:
    return name.endswith("Reader") or (name.startswith("Database") and not name.endswith("Error"))


def test_no_page_or_alert_asks_which_kind_of_store_it_reads() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in _sources("dashboard", "alerts")
        for n, line in enumerate(path.read_text().splitlines(), start=1)
        if _GREP.search(line)
    ]
    assert found == [], "call the read and catch NotAvailableOnBackend instead"


@pytest.mark.parametrize("folder", ["dashboard", "alerts", "gpulens/cli"])
def test_no_isinstance_on_a_reader_or_database_outside_storage(folder: str) -> None:
    found = []
    for path in _sources(folder):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance":
                names = [n for n in _class_names(node.args[1]) if _is_store_class(n)] if len(node.args) == 2 else []
                if names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: isinstance(..., {', '.join(names)})")
    assert found == []


def test_the_prometheus_reader_and_the_interface_load_no_sql_library() -> None:
    code = (
        "import sys\n"
        "import gpulens.storage.records, gpulens.storage.reading\n"
        "loaded = [m for m in ('sqlalchemy', 'alembic', 'gpulens.httpfetch', 'http.client') if m in sys.modules]\n"
        "import gpulens.storage.prometheus\n"
        "sql = [m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'alembic')]\n"
        "print(loaded, sql)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] []"


def test_the_sql_schema_stores_exactly_the_readable_fields() -> None:
    assert [(f.name, f.kind) for f in schema.SAMPLE_FIELDS] == [(f.name, f.kind) for f in READABLE_FIELDS]
    assert {spec.field for spec in GPU_FIELDS} <= set(FIELD_KINDS)
    with pytest.raises(ValueError, match="unknown fields no_such_field; known: up, "):
        check_fields(["utilization_ratio", "no_such_field"])


def test_both_readers_serve_every_read_of_the_interface() -> None:
    reads = {name for name in vars(StoreReader) if not name.startswith("_")} - {"url_redacted", "clock", "backend"}
    assert {"job_info", "job_account", "stuck_ranks", "drain_actions", "snapshot"} <= reads
    for reader in (SqlReader, PromReader):
        assert [name for name in sorted(reads) if not callable(getattr(reader, name, None))] == [], reader


def test_what_a_store_cannot_serve_is_named_with_the_store() -> None:
    exc = NotAvailableOnBackend("NCCL communicator history", "Prometheus")
    assert str(exc) == "NCCL communicator history: not available on Prometheus"
    assert (exc.what, exc.backend) == ("NCCL communicator history", "Prometheus")
    why = NotAvailableOnBackend("GPU processes", "Prometheus", "it holds no gpulens exporter series")
    assert str(why) == "GPU processes: not available on Prometheus (it holds no gpulens exporter series)"
