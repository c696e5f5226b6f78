"""NVLink through NVML: how many links a GPU has, their state, and per-link and total throughput.

Links are numbered from 0 and the first unsupported one ends them. Throughput comes from the cumulative KiB counters
of the batched field values (``exporter.nvmlfields``), turned into rates between reads; a GPU's total uses the
all-links counter where the driver has it, else the sum over its links. Link states are cached for
``LINK_STATE_REFRESH_S``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import pynvml

from exporter.nvmlcalls import LINK_END, Calls, as_text
from exporter.nvmlfields import ALL_LINKS, FI_NVLINK_RX, FI_NVLINK_TX, FieldValues
from exporter.nvmlgpu import Gpu
from gpulens.model import LinkReading

LINK_STATE_REFRESH_S: Final = 10.0  # 18 calls per H100 per read otherwise; a link that drops still shows at once as
# a fall in its throughput and a rise in its error counters


@dataclass(frozen=True, slots=True)
class Nvlink:
    """The NVLink part of one GPU's read."""

    links: tuple[LinkReading, ...] = ()
    active: int | None = None
    tx_bytes_per_second: float | None = None
    rx_bytes_per_second: float | None = None


def count_links(calls: Calls, gpu: Gpu) -> int:
    """The number of NVLinks: links are numbered from 0 and the first unsupported one ends them."""
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        _, code = calls.attempt(gpu, "nvmlDeviceGetNvLinkState", gpu.handle, link, quiet=LINK_END)
        if code is not None:
            return link
    return int(pynvml.NVML_NVLINK_MAX_LINKS)


def remote_pci_bus_id(calls: Calls, gpu: Gpu, link: int) -> str | None:
    """The PCI bus id of the device at the other end of ``link``."""
    remote = calls.call(gpu, "nvmlDeviceGetNvLinkRemotePciInfo", gpu.handle, link)
    return None if remote is None else as_text(remote.busId)


def _sum_complete(values: Sequence[float | None]) -> float | None:
    """The sum, or None when there is nothing to sum or any part is unknown."""
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


def read_nvlink(calls: Calls, gpu: Gpu, node: str, fields: FieldValues, now: float) -> Nvlink:
    """The GPU's links and its NVLink rates, from this read's field values taken at monotonic time ``now``."""
    if not gpu.links:
        return Nvlink()
    links = [_link(calls, gpu, node, link, fields, now) for link in range(gpu.links)]
    known = [link for link in links if link is not None]
    return Nvlink(
        links=tuple(known),
        active=sum(link.active for link in known) if known else None,
        tx_bytes_per_second=_total(gpu, FI_NVLINK_TX, fields, now, [k.tx_bytes_per_second for k in known]),
        rx_bytes_per_second=_total(gpu, FI_NVLINK_RX, fields, now, [k.rx_bytes_per_second for k in known]),
    )


def _link(calls: Calls, gpu: Gpu, node: str, link: int, fields: FieldValues, now: float) -> LinkReading | None:
    """One NVLink, or None when its state cannot be read."""
    tx = gpu.rates.rate((FI_NVLINK_TX, link), fields.get((FI_NVLINK_TX, link)), now)
    rx = gpu.rates.rate((FI_NVLINK_RX, link), fields.get((FI_NVLINK_RX, link)), now)
    cached = gpu.link_states.get(link)
    if cached is not None and 0 <= now - cached[0] < LINK_STATE_REFRESH_S:
        state = cached[1]
    else:
        state = calls.call(gpu, "nvmlDeviceGetNvLinkState", gpu.handle, link)
        gpu.link_states[link] = (now, state)
    if state is None:
        return None
    return LinkReading(
        node=node,
        gpu=gpu.index,
        uuid=gpu.uuid,
        link=link,
        active=int(state) == pynvml.NVML_FEATURE_ENABLED,
        tx_bytes_per_second=tx,
        rx_bytes_per_second=rx,
        remote_pci_bus_id=gpu.remote_pci_bus_ids[link],
    )


def _total(gpu: Gpu, field_id: int, fields: FieldValues, now: float, per_link: list[float | None]) -> float | None:
    """A GPU's NVLink rate from the all-links counter, or the sum over its links where that counter is absent."""
    total = fields.get((field_id, ALL_LINKS))
    if total is None:
        return _sum_complete(per_link)
    return gpu.rates.rate((field_id, ALL_LINKS), total, now)
