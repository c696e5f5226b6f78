"""``gpulens query nics``: every RDMA port as a table or JSON, one node's with --node."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gpulens.cli import main
from gpulens.storage.db import Database
from gpulens.storage.writer import Writer
from tests.dbtemplate import migrated_sqlite
from tests.storage.fabricdata import NDR, fabric_snapshot


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = migrated_sqlite(tmp_path / "gpulens.db")
    db = Database(url)
    now = time.time()
    writer = Writer(db)
    writer.write([fabric_snapshot("node-01", now - 10, 0), fabric_snapshot("node-02", now - 10, 0)])
    down: dict[str, Any] = {"state": "DOWN", "phys_state": "Polling", "up": False, "transmit_bytes_per_second": 0.0}
    writer.write(
        [fabric_snapshot("node-01", now, 1, transmit_bytes_per_second=25e9), fabric_snapshot("node-02", now, 1, **down)]
    )
    db.close()
    return url


def test_the_table_has_every_port_with_state_rate_traffic_gpus_and_errors(
    store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["query", "nics", "--db", store]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[:7] == [
        "NODE",
        "DEVICE",
        "PORT",
        "LINK_LAYER",
        "STATE",
        "RATE_BYTES_PER_SECOND",
        "TRANSMIT_BYTES_PER_SECOND",
    ]
    assert "LINK_DOWNED_TOTAL" in header
    assert len(lines) == 5
    first = lines[1].split()
    assert first[:5] == ["node-01", "mlx5_0", "1", "InfiniBand", "ACTIVE/LinkUp"]
    assert "400 Gb/s" in lines[1]
    assert "200 Gb/s" in lines[1]  # 25e9 B/s sent
    assert "50%" in lines[1]  # of the port's rate
    assert lines[3].split()[:5] == ["node-02", "mlx5_0", "1", "InfiniBand", "DOWN/Polling"]


def test_json_of_one_node(store: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["query", "nics", "--db", store, "--node", "node-02", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["node"], r["device"], r["port"]) for r in rows] == [("node-02", "mlx5_0", 1), ("node-02", "mlx5_1", 1)]
    first = rows[0]
    assert first["up"] is False
    assert first["rate_bytes_per_second"] == NDR
    assert first["transmit_rate_ratio"] == 0.0
    assert first["gpus"] == "0"
    assert first["link_downed_total"] == 0
    assert main(["query", "nics", "--db", store, "--node", "nowhere"]) == 0
    assert capsys.readouterr().out == "(no rows)\n"


def test_help_shows_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["query", "nics", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--node NODE" in out
    assert "gpulens query nics --node" in out
