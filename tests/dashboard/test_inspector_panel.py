"""The job page's bandwidth panel over the SQL store: each communicator's bus bandwidth now and at its best, the
node whose ranks measured least, and the share of what the job's links carry (NVLink within a node, the RDMA ports
across nodes)."""

from __future__ import annotations

from gpulens.dashboard.inspectorview import bandwidth_panel, link_ceiling, read_bandwidth
from gpulens.hardware import find_gpu_model
from gpulens.ncclinspect import BandwidthPoint
from gpulens.storage.db import Database
from gpulens.storage.records import GpuInfo
from gpulens.storage.sqlreader import SqlReader
from gpulens.storage.writer import Writer
from tests.dashboard.test_pages import text_of
from tests.storage.conftest import T0, _pg_root, clock, db, db_url, pg_server, private_pg_server
from tests.storage.test_inspectorstore import _measured

__all__ = ["_pg_root", "clock", "db", "db_url", "pg_server", "private_pg_server"]  # the storage tests' fixtures


def _gpu(node: str, index: int) -> GpuInfo:
    return GpuInfo(node, index, f"GPU-{node}-{index}", "NVIDIA H100 80GB HBM3", None, None, None, T0, T0)


def test_the_panel_shows_the_bandwidth_against_the_links(db: Database) -> None:
    writer = Writer(db)
    for k in range(3):
        writer.write([_measured(T0 + 10 * k, "n1", 45e9 - k * 5e9), _measured(T0 + 10 * k, "n2", 44e9)])  # type: ignore[list-item]
    found = read_bandwidth(SqlReader(db), "job-7", T0, T0 + 60)
    text = text_of(bandwidth_panel(found, (50e9, "network")))
    assert "NCCL: bus bandwidth against the links" in text
    assert "0x5f1e22c7a90b4d" in text
    assert "44.0 GB/s" in text  # now: the fastest node's (n2), n1 fell to 35
    assert "45.0 GB/s" in text  # the best in the range
    assert "n1" in text  # the slowest node now
    assert "88%" in text  # 44 of 50 GB/s per GPU
    assert bandwidth_panel(read_bandwidth(SqlReader(db), "other", T0, T0 + 60), (50e9, "network")) is None


def test_the_ceiling_is_nvlink_within_a_node() -> None:
    nvlink, links = link_ceiling(None, [_gpu("n1", i) for i in range(8)])  # type: ignore[arg-type]
    h100 = find_gpu_model("H100-SXM5-80GB")
    assert h100 is not None
    assert (nvlink, links) == (h100.nvlink_max_bytes_per_second, "NVLink")
    point = BandwidthPoint(T0, "n1", "0x1", "AllReduce", "256MiB", 360e9)
    assert "80%" in text_of(bandwidth_panel([point], (450e9, "NVLink")))
