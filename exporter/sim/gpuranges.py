"""GPU ranges in scenario files: ``NODE`` (every GPU), ``NODE:I``, ``NODE:I-J`` or ``NODE:I,J,K-L``, resolved to
the GPUs of known nodes; errors name the key they were read from."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

from gpulens.config import ConfigError
from gpulens.exporter.sim.specs import GpuRef, NodeSpec

_GPU_SPEC = re.compile(r"^(?P<node>[A-Za-z0-9._-]+)(?::(?P<sel>[0-9,\- ]+))?$")
_GPU_ITEM = re.compile(r"^(\d+)(?:-(\d+))?$")

# fail(table, index, key, message): the located error of the key being read.
Fail = Callable[[str, int | None, str, str], ConfigError]


def listing(names: Iterable[str], limit: int = 6) -> str:
    """Names for an error message, the first ``limit`` of them."""
    items = list(names)
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


class GpuRanges:
    """Reads GPU ranges against the scenario's ``nodes`` (filled in as they are read)."""

    def __init__(self, nodes: Mapping[str, NodeSpec], fail: Fail) -> None:
        self._nodes = nodes
        self._fail = fail

    def known_node(self, table: str, index: int | None, key: str, name: str) -> NodeSpec:
        node = self._nodes.get(name)
        if node is None:
            raise self._fail(table, index, key, f"unknown node {name!r} (the cluster has {listing(self._nodes)})")
        return node

    def gpu_list(self, table: str, index: int | None, key: str, value: str | list[str]) -> tuple[GpuRef, ...]:
        """A list of ranges (or one range): every GPU once, in order."""
        items = [value] if isinstance(value, str) else value
        if not items:
            raise self._fail(table, index, key, 'expected a list of GPU ranges such as ["node-00:0-7"]')
        gpus: dict[GpuRef, None] = {}
        for item in items:
            for ref in self.gpu_range(table, index, key, item):
                if ref in gpus:
                    raise self._fail(table, index, key, f"GPU {ref} is listed twice")
                gpus[ref] = None
        return tuple(gpus)

    def one_gpu(self, table: str, index: int | None, key: str, spec: str) -> GpuRef:
        """Exactly one GPU, ``NODE:I``."""
        refs = self.gpu_range(table, index, key, spec)
        if len(refs) != 1 or ":" not in spec:
            raise self._fail(table, index, key, f"expected one GPU such as node-01:3, got {spec!r:.40}")
        return refs[0]

    def gpu_range(self, table: str, index: int | None, key: str, spec: str) -> list[GpuRef]:
        """``NODE`` (every GPU), ``NODE:I``, ``NODE:I-J`` or ``NODE:I,J,K-L``."""
        m = _GPU_SPEC.match(spec.strip())
        syntax = f"not a GPU range: {spec!r:.40} (use NODE, NODE:I, NODE:I-J or NODE:I,J)"
        if not m:
            raise self._fail(table, index, key, syntax)
        node = self.known_node(table, index, key, m.group("node"))
        if m.group("sel") is None:
            return [GpuRef(node.name, i) for i in range(node.gpus)]
        refs: list[GpuRef] = []
        for item in m.group("sel").split(","):
            im = _GPU_ITEM.match(item.strip())
            if not im:
                raise self._fail(table, index, key, syntax)
            first = int(im.group(1))
            last = first if im.group(2) is None else int(im.group(2))
            if last < first:
                raise self._fail(table, index, key, f"GPU range {item.strip()!r} in {spec!r:.40} runs backwards")
            if last >= node.gpus:
                raise self._fail(table, index, key, f"{spec!r:.40}: {node.name} has GPUs 0-{node.gpus - 1}, not {last}")
            refs.extend(GpuRef(node.name, i) for i in range(first, last + 1))
        return refs
