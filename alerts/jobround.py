"""One job in one round: ``summarise_job`` condenses a job's GPU readings into a ``JobRound`` (minimum, median and
maximum utilization, traffic, power, clocks and memory), which the history keeps per job and the job rules compare
with the job's own reference rounds. ``gpulens.alerts.history`` holds the rounds; this module only summarises one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import add, attrgetter
from typing import Final

from gpulens.model import GpuReading

# A round is part of a job's reference when the job's median GPU is at least this busy and moves at least this much
# data (NVLink + PCIe, both directions), and its slowest SM clock is within this share of the median clock. Once the
# reference holds REFERENCE_SETTLED_ROUNDS rounds, a round must also move at least REFERENCE_MIN_SHARE of the
# reference's median traffic: a round that moves far less is not normal work (a stall's trickle is not a baseline).
REFERENCE_MIN_UTILIZATION: Final = 0.5
REFERENCE_MIN_TRAFFIC_BYTES_PER_SECOND: Final = 500e6
REFERENCE_MIN_CLOCK_RATIO: Final = 0.9
REFERENCE_MIN_SHARE: Final = 0.2
REFERENCE_SETTLED_ROUNDS: Final = 6

_TRAFFIC: Final = tuple(
    attrgetter(f"{link}_{way}_bytes_per_second") for link in ("nvlink", "pcie") for way in ("tx", "rx")
)


def traffic_bytes_per_second(reading: GpuReading) -> float | None:
    """NVLink plus PCIe throughput, both directions; ``None`` when the source reads none of them."""
    values = (
        reading.nvlink_tx_bytes_per_second,
        reading.nvlink_rx_bytes_per_second,
        reading.pcie_tx_bytes_per_second,
        reading.pcie_rx_bytes_per_second,
    )
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def nvlink_bytes_per_second(reading: GpuReading) -> float | None:
    values = [v for v in (reading.nvlink_tx_bytes_per_second, reading.nvlink_rx_bytes_per_second) if v is not None]
    return sum(values) if values else None


def _median(values: Iterable[float | None]) -> float | None:
    """``statistics.median`` of the values that are not ``None`` (inline: it runs for every job every round)."""
    present = sorted([v for v in values if v is not None])
    n = len(present)
    if not n:
        return None
    mid = n // 2
    return present[mid] if n % 2 else (present[mid - 1] + present[mid]) / 2


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as one round saw it: its user and the UUIDs of its GPUs (ordered by node and index)."""

    job_id: str
    user: str | None
    gpus: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class JobRound:
    """One job in one round, summarised over its GPUs that answered and are up."""

    time: float
    gpus: int  # GPUs read (up) this round
    utilization_min: float | None
    utilization_median: float | None
    utilization_max: float | None
    traffic_max: float | None  # bytes/s, NVLink + PCIe both directions, the busiest GPU
    traffic_median: float | None
    nvlink_median: float | None
    power_max: float | None
    power_median: float | None
    sm_active_median: float | None
    clock_ratio_min: float | None  # slowest SM clock / median SM clock
    memory_min: float | None  # bytes used on the GPU using the least
    memory_median: float | None

    @property
    def is_reference(self) -> bool:
        """Normal, communicating work: busy, moving data, no GPU's clock far below the others'."""
        return (
            self.gpus >= 2
            and self.utilization_median is not None
            and self.utilization_median >= REFERENCE_MIN_UTILIZATION
            and self.traffic_median is not None
            and self.traffic_median >= REFERENCE_MIN_TRAFFIC_BYTES_PER_SECOND
            and (self.clock_ratio_min is None or self.clock_ratio_min >= REFERENCE_MIN_CLOCK_RATIO)
        )

    @property
    def is_pause(self) -> bool:
        """Some GPU of the job is not working (a data-loader wait, a checkpoint, or some kind of hang)."""
        return self.utilization_min is not None and self.utilization_min < REFERENCE_MIN_UTILIZATION


def _sorted_median(ordered: Sequence[float]) -> float | None:
    """``_median`` of values already sorted."""
    n = len(ordered)
    if not n:
        return None
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def summarise_job(time: float, readings: Sequence[GpuReading]) -> JobRound:
    """The ``JobRound`` of a job's up GPUs' readings."""
    if len(readings) == 1:
        return _summarise_one(time, readings[0])
    # Each field's present values in reading order (comprehensions: the cheapest loop); each list is then sorted
    # once (as ``_median`` would) and min and max are taken of the lists themselves, as before.
    clocks = [c for r in readings if (c := r.sm_clock_hertz)]
    utilization = [v for r in readings if (v := r.utilization_ratio) is not None]
    memory = [float(v) for r in readings if (v := r.memory_used_bytes) is not None]
    power = [v for r in readings if (v := r.power_watts) is not None]
    sm_active = [v for r in readings if (v := r.sm_active_ratio) is not None]
    nvlink: list[float] = []
    traffic: list[float] = []
    columns = [list(map(read, readings)) for read in _TRAFFIC]  # NVLink TX, RX, PCIe TX, RX
    if not any(None in column for column in columns):  # the common case, by maps: 0 + tx + rx, as below
        nvlink = list(map(add, map(add, repeat(0), columns[0]), columns[1]))
        traffic = list(map(add, map(add, nvlink, columns[2]), columns[3]))
    for r in readings if not nvlink else ():
        # ``nvlink_bytes_per_second`` and ``traffic_bytes_per_second``: the same additions, in the same order, as
        # their ``sum`` of the values present (which starts from 0)
        ntx, nrx = r.nvlink_tx_bytes_per_second, r.nvlink_rx_bytes_per_second
        ptx, prx = r.pcie_tx_bytes_per_second, r.pcie_rx_bytes_per_second
        if ntx is not None and nrx is not None and ptx is not None and prx is not None:  # the common case
            link: float = 0 + ntx + nrx
            nvlink.append(link)
            traffic.append(link + ptx + prx)
            continue
        total: float | None = None
        if ntx is not None or nrx is not None:
            link = 0
            if ntx is not None:
                link += ntx
            if nrx is not None:
                link += nrx
            nvlink.append(link)
            total = link
        for value in (ptx, prx):
            if value is not None:
                total = (0 if total is None else total) + value
        if total is not None:
            traffic.append(total)
    clock_min = min(clocks) if clocks else None
    utilization_min = min(utilization, default=None)
    utilization_max = max(utilization, default=None)
    traffic_max = max(traffic) if traffic else None
    power_max = max(power) if power else None
    memory_min = min(memory, default=None)
    for values in (clocks, traffic, nvlink, utilization, memory, power, sm_active):
        values.sort()
    clock_median = _sorted_median(clocks)
    return JobRound(
        time=time,
        gpus=len(readings),
        utilization_min=utilization_min,
        utilization_median=_sorted_median(utilization),
        utilization_max=utilization_max,
        traffic_max=traffic_max,
        traffic_median=_sorted_median(traffic),
        nvlink_median=_sorted_median(nvlink),
        power_max=power_max,
        power_median=_sorted_median(power),
        sm_active_median=_sorted_median(sm_active),
        clock_ratio_min=clock_min / clock_median if clock_min is not None and clock_median else None,
        memory_min=memory_min,
        memory_median=_sorted_median(memory),
    )


def _summarise_one(time: float, r: GpuReading) -> JobRound:
    """``summarise_job`` of a single-GPU job (most jobs of an inference fleet), without the lists and medians."""
    util, traffic, clock = r.utilization_ratio, traffic_bytes_per_second(r), r.sm_clock_hertz
    memory = float(r.memory_used_bytes) if r.memory_used_bytes is not None else None
    return JobRound(
        time=time,
        gpus=1,
        utilization_min=util,
        utilization_median=util,
        utilization_max=util,
        traffic_max=traffic,
        traffic_median=traffic,
        nvlink_median=nvlink_bytes_per_second(r),
        power_max=r.power_watts,
        power_median=r.power_watts,
        sm_active_median=r.sm_active_ratio,
        clock_ratio_min=clock / clock if clock else None,
        memory_min=memory,
        memory_median=memory,
    )
