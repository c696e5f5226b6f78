"""The kernel log through a real exporter: the shared corpus fed with ``--kernel-log`` to an exporter over the fake
NVML on 127.0.0.1 shows each Xid on its GPU or its node address and each SXid once per event in /metrics,
promtool-clean; lines appended later are followed; the follower's memory stays bounded."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import gpulens.exporter.agent
from gpulens.config import ConfigError
from gpulens.exporter.agent import ExporterOptions, run_exporter
from gpulens.exporter.kernlogfollow import MAX_LINE_BYTES, KernelLogFollower
from gpulens.exporter.nvml import NvmlSource
from gpulens.exporter.xidledger import XidLedger
from gpulens.kernlog import pci_key
from gpulens.model import NodeSnapshot
from tests.conftest import http_get
from tests.exporter.test_metrics import promtool_check
from tests.fakes.fake_nvml import FakeNvml
from tests.realdata import real_folder

# GPUs on three of the corpus's addresses; its other addresses are no GPU of this node
GPU_BUS_IDS = ("00000000:9B:00.0", "00000009:01:00.0", "00000000:02:00.0")


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    nvml = FakeNvml.h100_node(gpus=3)
    for gpu, bus in zip(nvml.gpus, GPU_BUS_IDS, strict=True):
        gpu.pci_bus_id = bus
    monkeypatch.setattr(gpulens.exporter.agent, "_nvml_source", lambda options: NvmlSource(options.node, nvml=nvml))
    return nvml


@contextlib.contextmanager
def serve(options: ExporterOptions) -> Iterator[str]:
    announced: list[str] = []
    stop = threading.Event()
    thread = threading.Thread(target=run_exporter, args=(options, announced.append, stop), daemon=True)
    thread.start()
    try:
        for _ in range(600):
            if announced:
                break
            time.sleep(0.05)
        assert announced, "the exporter never announced itself"
        yield announced[0].rsplit(" ", 1)[1].removesuffix("/metrics")
    finally:
        stop.set()
        thread.join(timeout=10)


def samples(base: str) -> dict[str, list[Any]]:
    status, _, body = http_get(base + "/metrics")
    assert status == 200
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def wait_for(base: str, check: Any) -> dict[str, list[Any]]:
    got: dict[str, list[Any]] = {}
    for _ in range(200):
        got = samples(base)
        if check(got):
            return got
        time.sleep(0.05)
    raise AssertionError(f"/metrics never showed what the test waits for: {sorted(got)}")


def gpu_xid(got: dict[str, list[Any]], gpu: str, xid: str) -> float | None:
    values = [x.value for x in got["gpulens_gpu_xid_errors_total"] if (x.labels["gpu"], x.labels["xid"]) == (gpu, xid)]
    return values[0] if values else None


def expected(folder: Path) -> tuple[Counter[tuple[str, int]], Counter[tuple[str, int]]]:
    """Xid counts per (address, code) and SXid events per (address, code), from expect.json."""
    xids: Counter[tuple[str, int]] = Counter()
    sxids: Counter[tuple[str, int]] = Counter()
    previous = None
    for e in json.loads((folder / "expect.json").read_text()):
        key = (e["pci_bus_id"], e["code"])
        if e["kind"] == "xid":
            xids[key] += 1
        elif e["kind"] == "sxid" and key != previous:  # a line right after one of its event continues it
            sxids[key] += 1
        previous = key if e["kind"] == "sxid" else None
    return xids, sxids


def test_the_corpus_through_kernel_log_shows_in_metrics(fake_nvml: FakeNvml, tmp_path: Path, promtool: str) -> None:
    folder = real_folder("kernel-log")
    log = tmp_path / "kern.log"
    log.write_bytes((folder / "lines.txt").read_bytes())
    want_xids, want_sxids = expected(folder)
    options = ExporterOptions(
        source="nvml", listen="127.0.0.1:0", interval_s=0.2, node="n1", node_given=True, fabric=False,
        nccl_ras=False, job_info="none", kernel_log=str(log), state_dir=str(tmp_path / "state"),
    )  # fmt: skip
    gpus = {pci_key(b): i for i, b in enumerate(GPU_BUS_IDS)}
    with serve(options) as base:
        total = sum(want_xids.values())  # the last line's record ends when the log has been quiet a second
        got = wait_for(
            base,
            lambda s: (
                sum(x.value for x in s["gpulens_gpu_xid_errors_total"] + s.get("gpulens_node_xid_errors_total", []))
                == total
            ),
        )
        gpu_xids = Counter()
        for s in got["gpulens_gpu_xid_errors_total"]:
            gpu_xids[(GPU_BUS_IDS[int(s.labels["gpu"])], int(s.labels["xid"]))] = int(s.value)
        node_xids = {
            (s.labels["pci_bus_id"], int(s.labels["xid"])): int(s.value) for s in got["gpulens_node_xid_errors_total"]
        }
        on_gpus = {k: v for k, v in want_xids.items() if k[0] in gpus}
        assert {(pci_key(b), c): n for (b, c), n in gpu_xids.items()} == on_gpus
        assert node_xids == {k: v for k, v in want_xids.items() if k[0] not in gpus}
        sxids = {
            (s.labels["pci_bus_id"], int(s.labels["sxid"])): int(s.value)
            for s in got["gpulens_nvswitch_sxid_errors_total"]
        }
        assert sxids == dict(want_sxids)
        severities = {s.labels["sxid"]: s.labels["severity"] for s in got["gpulens_nvswitch_sxid_errors_total"]}
        assert severities["24007"] == "fatal"
        assert severities["20009"] == "non-fatal"
        actions = {
            (s.labels["gpu"], s.labels["xid"]): (s.labels["name"], s.labels["action"])
            for s in got["gpulens_gpu_xid_action_info"]
        }
        assert actions[("2", "79")] == ("GPU has fallen off the bus", "reboot")
        assert actions[("0", "119")] == ("GSP RPC timeout", "reset-gpu")
        _, _, body = http_get(base + "/metrics")
        result = promtool_check(promtool, body)
        assert result.returncode == 0, result.stdout + result.stderr
        # appended lines are followed: one more Xid 79 on GPU 2 (0000:02:00)
        with log.open("a") as f:
            f.write("[ 99.0] NVRM: Xid (PCI:0000:02:00): 79, pid=4242, name=train, GPU has fallen off the bus.\n")
        key = ("2", "79")
        later = wait_for(
            base,
            lambda s: any(
                (x.labels["gpu"], x.labels["xid"]) == key and x.value == 3 for x in s["gpulens_gpu_xid_errors_total"]
            ),
        )
        assert [
            x.value for x in later["gpulens_gpu_xid_errors_total"] if (x.labels["gpu"], x.labels["xid"]) == key
        ] == [3]
        # one fault seen by NVML and in the kernel log counts once: XID 48 on GPU 0 (0000:9b:00), NVML's event first
        fake_nvml.xid(0, 48)
        wait_for(base, lambda s: gpu_xid(s, "0", "48") == 1)
        with log.open("a") as f:
            f.write("[ 99.5] NVRM: Xid (PCI:0000:9b:00): 48, pid=31337, name=train.py, a double-bit error.\n")
            f.write("[ 99.6] NVRM: Xid (PCI:0000:9b:00): 13, pid=31337, name=train.py, a later line\n")
        got = wait_for(base, lambda s: gpu_xid(s, "0", "13") == 1)  # read in order: the 48 line was read before
        assert gpu_xid(got, "0", "48") == 1
    assert (tmp_path / "state" / "xid-occurrences.json").exists()


def test_the_follower_reads_a_million_lines_and_a_huge_line_in_bounded_memory(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    noise = b"[ 1.000000] eth0: link becomes ready, and a line of ordinary length for the kernel log\n"
    with log.open("wb") as f:
        f.write(b"NVRM: Xid (PCI:0000:3b:00): 13, " + b"x" * (50 * 1024 * 1024) + b"\n")  # 50 MiB in one line
        for i in range(1_000_000):
            f.write(noise if i % 1000 else b"NVRM: Xid (PCI:0000:3b:00): 13, x\n")
    ledger = XidLedger()
    follower = KernelLogFollower(str(log), ledger, poll_s=0.05)
    tracemalloc.start()
    try:
        follower.start()
        deadline = time.monotonic() + 120
        while follower.lines < 1_000_001 and time.monotonic() < deadline:
            time.sleep(0.1)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        follower.close()
    assert follower.lines == 1_000_001
    assert follower.errors() == {"kernel_log_line_too_long": 1}
    assert peak < 4 * 1024 * 1024, f"peak {peak / 1e6:.1f} MB"
    assert ledger._counts == {("0000:3b:00", 13): 1001}
    assert MAX_LINE_BYTES <= 8192


def test_kmsg_records_are_read_one_per_read_with_their_escapes() -> None:
    """/dev/kmsg hands out one record per read(), its dictionary lines after the first line feed and a multi-line
    message with ``\\x0a`` escapes; a SOCK_SEQPACKET pair behaves the same."""
    ledger = XidLedger()
    follower = KernelLogFollower("/dev/kmsg", ledger)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    records = [
        b"4,20417,5123456789,-;NVRM: Xid (PCI:0000:3b:00): 48, x\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n",
        b"6,20418,5123456790,-;" + b"y" * 20_000 + b"\n",
        b"4,20419,5123456791,-;NVRM: The NVIDIA GPU 0000:c1:00.0\\x0aNVRM: (PCI ID: 10de:2335) installed in this system"
        b" has\\x0aNVRM: fallen off the bus and answers no more.\n",
    ]
    for record in records:
        theirs.send(record[:8192])
    theirs.close()
    reader = threading.Thread(target=follower.read_records, args=(ours.fileno(),))
    reader.start()
    reader.join(timeout=10)
    ours.close()
    assert follower.lines == 3
    assert ledger._counts == {("0000:3b:00", 48): 1, ("0000:c1:00", 79): 1}


def test_dev_kmsg_is_read_from_its_end() -> None:
    path = "/dev/kmsg"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        pytest.skip(f"{path} is not readable here ({exc.strerror})")
    in_ring = 0
    try:
        while in_ring < 10_000:
            try:
                os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: overwritten while read; the ring holds records
                pass
            in_ring += 1
    finally:
        os.close(fd)
    if in_ring < 10:
        pytest.skip(f"{path} holds too few records to tell")
    follower = KernelLogFollower(path, XidLedger(), poll_s=0.05)
    follower.start()
    time.sleep(0.5)
    follower.close()
    assert follower.lines < in_ring // 2  # none of the ring's past (at most what the kernel logged meanwhile)


def test_a_file_read_again_after_a_restart_adds_no_occurrences(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("[ 1.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=77, name=x, GPU has fallen off the bus.\n")
    state = tmp_path / "state"

    def run() -> dict[str, dict[int, int]]:
        ledger = XidLedger(str(state))
        follower = KernelLogFollower(str(log), ledger, poll_s=0.05)
        follower.start()
        for _ in range(100):
            if ledger._counts:
                break
            time.sleep(0.05)
        follower.close()
        ledger.enrich(NodeSnapshot(node="n", timestamp=0.0, source="test"))  # a collection: occurrences are saved
        assert ledger._counts == {("0000:3b:00", 79): len(log.read_text().splitlines())}  # counters: the whole file
        return ledger._occurrences

    assert run() == {"pci:0000:3b:00": {79: 1}}
    assert run() == {"pci:0000:3b:00": {79: 1}}  # the same line again: not a new occurrence
    with log.open("a") as f:
        f.write("[ 2.0] NVRM: Xid (PCI:0000:3b:00): 79, pid=78, name=x, GPU has fallen off the bus.\n")
    assert run() == {"pci:0000:3b:00": {79: 2}}


def test_a_missing_kernel_log_is_a_config_error_and_a_remote_dcgm_reads_none(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--kernel-log"):
        gpulens.exporter.agent._kernel_log(ExporterOptions(kernel_log=str(tmp_path / "absent")))
    local = gpulens.exporter.agent._local_gpus
    assert local(ExporterOptions(source="nvml"))
    assert local(ExporterOptions(source="dcgm", dcgm_url="http://127.0.0.1:9400/metrics"))
    assert local(ExporterOptions(source="dcgm", dcgm_url="http://localhost:9400/metrics"))
    assert not local(ExporterOptions(source="dcgm", dcgm_url="http://gpu-node-07:9400/metrics"))
    assert gpulens.exporter.agent._kernel_log(ExporterOptions(source="sim")) is None  # the simulator has its own
