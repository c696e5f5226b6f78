"""dcgm-exporter pages for tests: the fixture files, GPU identities, a parse helper and a page-mutating strategy."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from gpulens.dcgmpage import DcgmParse, parse_dcgm_metrics

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dcgm"
MIB = 1024 * 1024
GPU0 = "GPU-1f0c8a52-7d3e-4b91-a6c2-0e5d9b7f3a10"
GPU1 = "GPU-9b2e4d71-3c58-4f0a-8e16-d7a4c3b2e905"
MIG_GPU = "GPU-5a7c9e31-02b4-46d8-9f1a-3c6e8b0d2f47"
ID0 = f'gpu="0",UUID="{GPU0}",modelName="NVIDIA H100 80GB HBM3"'
ID1 = f'gpu="1",UUID="{GPU1}",modelName="NVIDIA H100 80GB HBM3"'


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def parse(text: str, node: str | None = None) -> DcgmParse:
    return parse_dcgm_metrics(text, node=node, timestamp=1_700_000_000.0)


FIXTURE_NAMES = ["legacy.prom", "current.prom", "mig.prom", "malformed.prom"]
FIXTURE_TEXTS = {name: fixture(name) for name in FIXTURE_NAMES}
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def mutated_fixture(draw: st.DrawFn) -> bytes:
    data = bytearray(FIXTURE_TEXTS[draw(st.sampled_from(FIXTURE_NAMES))].encode())
    for _ in range(draw(st.integers(0, 8))):
        op = draw(st.sampled_from(["delete_line", "flip", "truncate", "inject"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "delete_line":
            start = data.rfind(b"\n", 0, at) + 1
            end = data.find(b"\n", at)
            del data[start : len(data) if end < 0 else end + 1]
        elif op == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[at:]
        elif op == "inject":
            data[at:at] = draw(st.binary(max_size=30) | st.sampled_from([b"{", b'"', b"\\", b"\r\n", b" NaN", b"}"]))
    return bytes(data)
