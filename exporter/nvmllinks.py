"""NVLink through NVML: how many links a GPU has, their state, per-link and total throughput, and error totals.

Links are numbered from 0 and the first unsupported one ends them. Where GPM measures NVLink (``exporter.nvmlgpm``)
throughput is its average over the collection interval; elsewhere it comes from the cumulative KiB counters of the
batched field values (``exporter.nvmlfields``), turned into rates between reads, and a GPU's total uses the all-links
counter where the driver has it, else the sum over its links. Link states are cached for ``LINK_STATE_REFRESH_S``.
Error totals come from the all-links error fields; where the driver refuses one (NotSupported, as Hopper may), it is
the sum over links of ``nvmlDeviceGetNvLinkErrorCounter``, refreshed every ``LINK_STATE_REFRESH_S``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import pynvml  # noqa: TID251 (the NVML modules are the pynvml choke point)

from gpulens.exporter.nvmlcalls import LINK_END, Calls, as_int, as_text
from gpulens.exporter.nvmlfields import (
    ALL_LINKS,
    FI_NVLINK_CRC,
    FI_NVLINK_RECOVERY,
    FI_NVLINK_REPLAY,
    FI_NVLINK_RX,
    FI_NVLINK_TX,
    NVLINK_ERROR_TOTALS,
    FieldValues,
)
from gpulens.exporter.nvmlgpm import GpmValues
from gpulens.exporter.nvmlgpu import Gpu
from gpulens.model import LinkReading

LINK_STATE_REFRESH_S: Final = 10.0  # 18 calls per H100 per read otherwise; a link that drops still shows at once as
# a fall in its throughput and a rise in its error counters

# The per-link error counter standing in for each all-links error field.
_ERROR_COUNTERS: Final[dict[int, int]] = {
    FI_NVLINK_CRC: pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    FI_NVLINK_REPLAY: pynvml.NVML_NVLINK_ERROR_DL_REPLAY,
    FI_NVLINK_RECOVERY: pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,
}


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


def read_nvlink(
    calls: Calls, gpu: Gpu, node: str, fields: FieldValues, now: float, gpm: GpmValues | None = None
) -> Nvlink:
    """The GPU's links and its NVLink rates at monotonic time ``now``: from ``gpm`` where GPM measures NVLink, else
    from this read's field values."""
    if not gpu.links:
        return Nvlink()
    if gpm is None:
        tx = [gpu.rates.rate((FI_NVLINK_TX, link), fields.get((FI_NVLINK_TX, link)), now) for link in range(gpu.links)]
        rx = [gpu.rates.rate((FI_NVLINK_RX, link), fields.get((FI_NVLINK_RX, link)), now) for link in range(gpu.links)]
    else:
        tx, rx = list(gpm.links("tx", gpu.links)), list(gpm.links("rx", gpu.links))
    links = [_link(calls, gpu, node, link, now, tx[link], rx[link]) for link in range(gpu.links)]
    known = [link for link in links if link is not None]
    if gpm is None:
        tx_total = _total(gpu, FI_NVLINK_TX, fields, now, [k.tx_bytes_per_second for k in known])
        rx_total = _total(gpu, FI_NVLINK_RX, fields, now, [k.rx_bytes_per_second for k in known])
    else:
        tx_total, rx_total = gpm.get("nvlink_tx"), gpm.get("nvlink_rx")
    return Nvlink(
        links=tuple(known),
        active=sum(link.active for link in known) if known else None,
        tx_bytes_per_second=tx_total,
        rx_bytes_per_second=rx_total,
    )


def _link(
    calls: Calls, gpu: Gpu, node: str, link: int, now: float, tx: float | None, rx: float | None
) -> LinkReading | None:
    """One NVLink, or None when its state cannot be read."""
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


def nvlink_errors(calls: Calls, gpu: Gpu, fields: FieldValues, now: float) -> tuple[int | None, ...]:
    """The CRC flit, replay and recovery error totals over the GPU's links (``NVLINK_ERROR_TOTALS`` order)."""
    if not gpu.links:
        return (None,) * len(NVLINK_ERROR_TOTALS)
    return tuple(_error_total(calls, gpu, field_id, fields, now) for field_id in NVLINK_ERROR_TOTALS)


def _error_total(calls: Calls, gpu: Gpu, field_id: int, fields: FieldValues, now: float) -> int | None:
    if field_id not in gpu.nvlink_errors_per_link:
        return as_int(fields.get((field_id, 0)))
    cached = gpu.link_errors.get(field_id)
    if cached is not None and 0 <= now - cached[0] < LINK_STATE_REFRESH_S:
        return cached[1]
    total: int | None = 0
    answered = False
    for link in range(gpu.links):
        value, code = calls.attempt(
            gpu, "nvmlDeviceGetNvLinkErrorCounter", gpu.handle, link, _ERROR_COUNTERS[field_id], quiet=LINK_END
        )
        if code is None:
            total, answered = (total or 0) + int(value), True
        elif code not in LINK_END:  # a link whose counter failed: no total this time rather than a total that dips
            total = None
            break
    result = total if answered else None
    gpu.link_errors[field_id] = (now, result)
    return result
