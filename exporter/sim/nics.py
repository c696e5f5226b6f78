"""A simulated node's RDMA ports: how many, at what rate and link layer, by GPU model, and the GPUs each is next to.

The defaults follow real systems (docs/scenarios.md): an HGX H100/H200 board has eight ConnectX-7 400 Gb/s NDR
InfiniBand ports, one per GPU (GPU i next to ``mlx5_i``); a DGX A100 four 200 Gb/s HDR ports, one per GPU pair;
an L40S server two 100 Gb/s RoCE (Ethernet) ports. ``[[nodes]]`` may override the count, the rate and the link
layer; the GPUs are then shared out evenly, in order, among the ports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from gpulens.exporter.sim.specs import NicSpec
from gpulens.fabricmodel import LINK_LAYER_ETHERNET, LINK_LAYER_INFINIBAND

LINK_LAYERS: Final = (LINK_LAYER_INFINIBAND, LINK_LAYER_ETHERNET)
LINK_WIDTH: Final = 4
MAX_NICS: Final = 32
# InfiniBand lane speeds by their per-lane signalling rate in Gb/s (a 4X NDR port signals 400 Gb/s).
_LANE_SPEEDS: Final[Mapping[float, str]] = {
    10.0: "QDR",
    14.0: "FDR",
    25.0: "EDR",
    50.0: "HDR",
    100.0: "NDR",
    200.0: "XDR",
}
_BUS: Final = (0x17, 0x29, 0x39, 0x5C, 0x99, 0xAA, 0xB9, 0xDA)  # beside the HGX GPUs' switches


@dataclass(frozen=True, slots=True)
class NicLayout:
    """A node type's RDMA ports: how many, each one's rate in Gb/s and their link layer."""

    count: int
    rate_gbps: float
    link_layer: str


DEFAULT_LAYOUTS: Final[Mapping[str, NicLayout]] = {
    "H100-SXM5-80GB": NicLayout(8, 400.0, LINK_LAYER_INFINIBAND),
    "H200-SXM-141GB": NicLayout(8, 400.0, LINK_LAYER_INFINIBAND),
    "A100-SXM4-80GB": NicLayout(4, 200.0, LINK_LAYER_INFINIBAND),
    "L40S": NicLayout(2, 100.0, LINK_LAYER_ETHERNET),
}
FALLBACK_LAYOUT: Final = NicLayout(2, 200.0, LINK_LAYER_INFINIBAND)


def default_layout(model_name: str) -> NicLayout:
    return DEFAULT_LAYOUTS.get(model_name, FALLBACK_LAYOUT)


def lane_speed(rate_gbps: float, width: int = LINK_WIDTH) -> str | None:
    """The per-lane speed name of a port signalling ``rate_gbps`` over ``width`` lanes (``None`` if none fits)."""
    return _LANE_SPEEDS.get(round(rate_gbps / width, 3))


def node_nics(gpus: int, layout: NicLayout) -> tuple[NicSpec, ...]:
    """The ports of a node with ``gpus`` GPUs: ``mlx5_0`` ... in order, the GPUs shared out evenly among them."""
    near: list[list[int]] = [[] for _ in range(layout.count)]
    for gpu in range(gpus):
        near[gpu * layout.count // gpus].append(gpu)
    return tuple(
        NicSpec(
            device=f"mlx5_{i}",
            port=1,
            link_layer=layout.link_layer,
            rate_bytes_per_second=layout.rate_gbps * 1e9 / 8.0,
            link_width=LINK_WIDTH,
            link_speed=lane_speed(layout.rate_gbps),
            gpus=tuple(near[i]),
            pci_bus_id=_pci_bus_id(i),
            numa_node=0 if i < (layout.count + 1) // 2 else 1,
        )
        for i in range(layout.count)
    )


def nic_of_gpu(nics: tuple[NicSpec, ...], gpu: int) -> NicSpec | None:
    """The port next to GPU ``gpu``."""
    return next((n for n in nics if gpu in n.gpus), None)


def _pci_bus_id(index: int) -> str:
    if index < len(_BUS):
        return f"0000:{_BUS[index]:02x}:00.0"
    return f"0000:{0xC0 + index:02x}:00.0"
