"""NCCL Inspector output read by the node agent: the fixtures' JSON lines and Prometheus files of NCCL 2.28, 2.29.3
and 2.30 read into bytes/s and seconds; logs tailed from where they stood, cut lines waited for, bad lines counted;
the per-pass bounds (bytes, series, line length) hold; the families render promtool-clean and the snapshot
document carries the view; a real exporter with --nccl-inspector-dir serves them."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from gpulens.exporter.agent import ExporterOptions
from gpulens.exporter.inspectorparse import (
    InspectorLineError,
    message_size_bytes,
    parse_json_line,
    parse_prom_page,
)
from gpulens.exporter.inspectorread import InspectorReader
from gpulens.exporter.metrics import ExporterHealth, render_metrics
from gpulens.model import ProcessReading
from gpulens.ncclinspect import MAX_SERIES, InspectorRecord, size_class, size_class_bytes, summarise
from gpulens.snapshotcodec import snapshot_from_bytes, snapshot_to_bytes
from tests.exporter.test_kernlog_agent import fake_nvml, serve, wait_for  # noqa: F401 - the fixture
from tests.exporter.test_metrics import promtool_check
from tests.fakes.static_source import node_snapshot

FIXTURES = Path(__file__).parent.parent / "fixtures" / "ncclinspector"
JSON_LOG = FIXTURES / "json-2.28" / "gpu-node-07-pid31337.log"
UUID = "3c9b0f7e-1a2d-4e5f-8a6b-0c1d2e3f4a5b"
PROM_29 = FIXTURES / "prom-2.29" / f"nccl_inspector_metrics_{UUID}.prom"
PROM_30 = FIXTURES / "prom-2.30" / f"nccl_inspector_metrics_{UUID}.prom"


def test_size_classes_are_powers_of_two() -> None:
    assert size_class(268_435_456) == "256MiB"
    assert size_class(3 << 20) == "2MiB"
    assert size_class(8) == "8B"
    assert size_class(0) == "0B"
    assert size_class(1 << 40) == "1TiB"
    assert all(size_class_bytes(size_class(1 << p)) == 1 << p for p in range(0, 59))
    assert size_class_bytes("fast") is None


def test_json_lines_read_in_bytes_per_second_and_seconds() -> None:
    lines = JSON_LOG.read_bytes().split(b"\n")
    first = parse_json_line(lines[0])
    assert first == InspectorRecord(
        comm="0x5f1e22c7a90b4d",
        collective="AllReduce",
        size_bytes=268_435_456,
        bus_bytes_per_second=pytest.approx(359.511771e9),
        seconds=pytest.approx(1400e-6),
        rank=0,
        pid=31337,
    )
    verbose = parse_json_line(lines[3])
    assert verbose is not None
    assert verbose.collective == "ReduceScatter"
    assert verbose.size_bytes == 3 << 20
    assert parse_json_line(lines[4]) is None  # a point-to-point record (2.30): not a collective
    with pytest.raises(InspectorLineError, match="coll_busbw_gbs is not a number"):
        parse_json_line(lines[5])  # NCCL prints an untimed bandwidth as "nan"
    for bad, why in [
        (b"{", "not a JSON object"),
        (b"[1]", "not a JSON object"),
        (b'{"header": {}}', "no 'coll_perf'"),
        (b'{"header":{"id":"x"},"metadata":{},"coll_perf":{"coll":"AllReduce","coll_msg_size_bytes":-1}}', "size"),
        (b" " * 20_000, "bytes"),
    ]:
        with pytest.raises(InspectorLineError, match=why):
            parse_json_line(bad)


def test_prometheus_files_of_2_29_and_2_30() -> None:
    page = parse_prom_page(PROM_29.read_text(), gpu="GPU-x")
    assert page.bad_lines == 0
    by_coll = {r.collective: r for r in page.records}
    assert set(by_coll) == {"AllReduce", "AllGather"}
    ar = by_coll["AllReduce"]
    assert (ar.comm, ar.rank, ar.job_id, ar.gpu, ar.size_bytes) == ("0x5f1e22c7a90b4d", 3, "4242", "GPU-x", 256 << 20)
    assert ar.bus_bytes_per_second == pytest.approx(357.2e9)
    assert ar.seconds == pytest.approx(1409e-6)
    page = parse_prom_page(PROM_30.read_text())
    by_comm = {r.comm: r for r in page.records}
    assert set(by_comm) == {"dp", "tp"}  # the point-to-point families are not collectives
    assert by_comm["dp"].size_bytes == 256 << 20
    assert by_comm["dp"].rank is None
    assert by_comm["tp"].size_bytes == 3 << 20
    assert by_comm["tp"].seconds == pytest.approx(27e-6)
    assert message_size_bytes("16.00GB") == 16 << 30
    assert message_size_bytes("512B") == 512
    assert message_size_bytes("lots") is None


def test_prometheus_bad_lines_are_counted_not_fatal() -> None:
    text = (
        'nccl_bus_bandwidth_gbs{comm_id="0x1",collective="AllReduce",message_size="1.00MB"} 10\n'  # no time
        'nccl_bus_bandwidth_gbs{comm_id="0x2",collective="AllReduce",message_size="1.00MB"} -3\n'
        "this is not a sample\n"
        'nccl_bus_bandwidth_gbs{comm_id="0x3",collective="AllReduce",message_size="1.00MB"} 10\n'
        'nccl_collective_exec_time_microseconds{comm_id="0x3",collective="AllReduce",message_size="1.00MB"} 100\n'
    )
    page = parse_prom_page(text)
    assert [r.comm for r in page.records] == ["0x3"]
    assert page.bad_lines == 3


def test_summary_is_a_geometric_mean_per_key_and_names_the_slowest_rank() -> None:
    records = [parse_json_line(line) for line in JSON_LOG.read_bytes().split(b"\n")[:3]]
    series, dropped = summarise([r for r in records if r is not None])
    assert dropped == 0
    assert len(series) == 1
    s = series[0]
    assert s.bus_bytes_per_second == pytest.approx(math.exp(math.log(359.511771e9 * 314.5728e9 * 157.2864e9) / 3))
    assert s.seconds == pytest.approx((1400 + 1600 + 3200) / 3 * 1e-6)
    assert (s.samples, s.ranks, s.slowest_rank) == (3, 2, 1)
    assert s.slowest_bus_bytes_per_second == pytest.approx(157.2864e9)
    many = [InspectorRecord(f"0x{i}", "AllReduce", 1 << 20, 1e9, 1e-3) for i in range(MAX_SERIES + 10)]
    series, dropped = summarise(many)
    assert (len(series), dropped) == (MAX_SERIES, 10)


def _snapshot_with_processes() -> object:
    snap = node_snapshot("gpu-node-07", gpus=2)
    procs = (
        ProcessReading("gpu-node-07", 0, snap.gpus[0].uuid, 31337, job_id="4242"),
        ProcessReading("gpu-node-07", 1, snap.gpus[1].uuid, 31338, job_id="4242"),
    )
    return snap.replace(processes=procs)


def test_the_reader_tails_logs_from_where_they_stood(tmp_path: Path) -> None:
    snap = _snapshot_with_processes()
    old = tmp_path / "gpu-node-07-pid1.log"
    old.write_bytes(JSON_LOG.read_bytes().split(b"\n")[0] + b"\n")
    reader = InspectorReader(str(tmp_path))
    view = reader.read(snap)  # type: ignore[arg-type]
    assert (view.files, view.records, view.series) == (1, 0, ())  # history before the agent started: not read
    log = tmp_path / "job" / "gpu-node-07-pid31337.log"
    log.parent.mkdir()
    log.write_bytes(JSON_LOG.read_bytes())  # appears later: read from its start
    view = reader.read(snap)  # type: ignore[arg-type]
    assert view.records == 4
    assert view.files == 2
    keys = {(s.job_id, s.comm, s.collective, s.size) for s in view.series}
    assert keys == {
        ("4242", "0x5f1e22c7a90b4d", "AllReduce", "256MiB"),
        ("4242", "0x5f1e22c7a90b4d", "ReduceScatter", "2MiB"),
    }
    allreduce = next(s for s in view.series if s.collective == "AllReduce")
    assert allreduce.slowest_gpu == snap.gpus[1].uuid  # type: ignore[attr-defined]  # pid 31338 on GPU 1
    assert reader.errors["nccl_inspector_bad_line"] == 1  # the "nan" line; the cut line waits for its end
    with log.open("ab") as fh:  # the cut line ends, with a new record after it
        fh.write(b'format_version":"v4.0"},"coll_perf":{}}\n' + JSON_LOG.read_bytes().split(b"\n")[1] + b"\n")
    view = reader.read(snap)  # type: ignore[arg-type]
    assert view.records == 1
    assert reader.errors["nccl_inspector_bad_line"] == 2
    assert len(view.series) == 2  # the ReduceScatter series is kept (measured within keep_s)


def test_the_reader_bounds_each_pass(tmp_path: Path) -> None:
    snap = _snapshot_with_processes()
    reader = InspectorReader(str(tmp_path), max_bytes=4_096)
    reader.read(snap)  # type: ignore[arg-type]
    line = JSON_LOG.read_bytes().split(b"\n")[0] + b"\n"
    (tmp_path / "gpu-node-07-pid2.log").write_bytes(line * 100)  # ~50 KB: read over several passes
    counts = [reader.read(snap).records for _ in range(20)]  # type: ignore[arg-type]
    assert max(counts) <= 4_096 // len(line)
    assert sum(counts) == 100
    long = tmp_path / "gpu-node-07-pid3.log"
    long.write_bytes(b"x" * 100_000 + b"\n" + line)  # one line far over the limit, then a good one
    reader = InspectorReader(str(tmp_path), max_bytes=1 << 20)
    reader._first = False
    total = sum(reader.read(snap).records for _ in range(3))  # type: ignore[arg-type]
    assert total == 101
    assert reader.errors["nccl_inspector_bad_line"] == 1


def test_prometheus_files_map_to_the_gpu_by_uuid_and_expire(tmp_path: Path) -> None:
    snap = _snapshot_with_processes()
    gpu = snap.gpus[0].uuid  # type: ignore[attr-defined]
    name = f"nccl_inspector_metrics_{gpu.lower().removeprefix('gpu-')}.prom"
    shutil.copy(PROM_29, tmp_path / name)
    now = [(tmp_path / name).stat().st_mtime]
    reader = InspectorReader(str(tmp_path), keep_s=60, wall=lambda: now[0])
    view = reader.read(snap)  # type: ignore[arg-type]
    assert {s.collective for s in view.series} == {"AllReduce", "AllGather"}
    assert all(s.slowest_gpu == gpu and s.job_id == "4242" for s in view.series)
    now[0] += 120  # the file was not rewritten since: its job ended
    assert reader.read(snap).series == ()  # type: ignore[arg-type]


def test_the_view_renders_promtool_clean_and_travels_in_the_snapshot(tmp_path: Path, promtool: str) -> None:
    snap = _snapshot_with_processes()
    shutil.copy(JSON_LOG, tmp_path)
    shutil.copy(PROM_30, tmp_path)
    reader = InspectorReader(str(tmp_path))
    reader._first = False
    out = reader.enrich(snap)  # type: ignore[arg-type]
    assert out.inspector is not None
    assert len(out.inspector.series) == 4
    assert out.errors["nccl_inspector_bad_line"] == 1
    body = render_metrics(out, ExporterHealth(0.0, 0.0, {}))
    result = promtool_check(promtool, body)
    assert result.returncode == 0, result.stdout + result.stderr
    text = body.decode()
    assert 'gpulens_nccl_bus_bandwidth_bytes_per_second{node="gpu-node-07",job_id="4242",comm="dp",' in text
    assert text.count("gpulens_nccl_collective_seconds{") == 4
    back = snapshot_from_bytes(snapshot_to_bytes(out))
    assert back.inspector == out.inspector


def test_a_real_exporter_serves_the_inspector_families(fake_nvml: object, tmp_path: Path) -> None:  # noqa: F811
    options = ExporterOptions(
        source="nvml", listen="127.0.0.1:0", interval_s=0.2, node="n1", node_given=True, fabric=False,
        nccl_ras=False, job_info="none", kernel_log="", nccl_inspector_dir=str(tmp_path),
    )  # fmt: skip
    with serve(options) as base:
        shutil.copy(PROM_30, tmp_path)  # a Prometheus file is read whole whenever it appears
        got = wait_for(base, lambda s: len(s.get("gpulens_nccl_bus_bandwidth_bytes_per_second", [])) == 2)
        comms = {s.labels["comm"]: s.value for s in got["gpulens_nccl_bus_bandwidth_bytes_per_second"]}
        assert comms == {"dp": pytest.approx(351.75e9), "tp": pytest.approx(118e9)}
        assert got["gpulens_exporter_reader_stale"]
        assert any(s.labels["reader"] == "nccl_inspector" for s in got["gpulens_exporter_reader_stale"])
