"""One GPU as the NVML source holds it: its handle, the static facts read at start-up, and what reads remember
(counter values for rates, cached link states, its GPM samples)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

KIB: Final = 1024  # NVML's "KB/s" (PCIe throughput) and "KiB" (NVLink counters) are both 1024 bytes
SLOW_REFRESH_S: Final = 10.0  # how long values that change rarely (``SlowValues``, the MIG layout) are reused


class CounterRates:
    """Rates of cumulative KiB counters between successive reads; a counter that goes backwards restarts."""

    def __init__(self) -> None:
        self._last: dict[tuple[int, int], tuple[float, float]] = {}

    def rate(self, key: tuple[int, int], kib: float | None, now: float) -> float | None:
        """Bytes per second since the previous value of ``key``; None on the first value or after a reset."""
        if kib is None:
            return None
        previous = self._last.get(key)
        self._last[key] = (kib, now)
        if previous is None or kib < previous[0] or now <= previous[1]:
            return None
        return (kib - previous[0]) * KIB / (now - previous[1])


@dataclass(frozen=True, slots=True)
class SlowValues:
    """Values that change rarely, read every ``SLOW_REFRESH_S`` instead of every collection (``exporter.nvmldevice``):
    the enforced power limit (set by an administrator), and the PCIe replay, ECC and row-remapping totals (counters
    that rise on rare faults; the XID events of the same faults arrive at once through ``gpulens.exporter.nvmlxid``)."""

    power_limit_watts: float | None = None
    pcie_replays: int | None = None
    ecc_corrected: int | None = None
    ecc_uncorrected: int | None = None
    rows_correctable: int | None = None
    rows_uncorrectable: int | None = None
    rows_pending: bool | None = None
    rows_failure: bool | None = None


@dataclass(frozen=True, slots=True)
class MigIdentity:
    """One MIG device of the layout: its handle and what does not change while it exists (``exporter.nvmlmig``)."""

    handle: Any
    mig_uuid: str
    gpu_instance_id: int
    compute_instance_id: int | None
    profile: str | None


@dataclass(frozen=True, slots=True)
class GpmMetric:
    """One GPM metric a GPU is asked for (``gpulens.exporter.nvmlgpm``)."""

    key: str  # a GpmValues key: "pcie_tx", "sm_active", ..., or "link_tx:3" for one link
    quantity: str
    name: str  # the pynvml constant's name, for messages
    metric_id: int
    scale: float


@dataclass(slots=True)
class GpmState:
    """One GPU's GPM state: its two samples, which holds the previous read, and the quantities GPM still serves."""

    samples: tuple[Any, Any]
    metrics: tuple[GpmMetric, ...]
    request: Any  # a reused c_nvmlGpmMetricsGet_t
    quantities: set[str]
    previous: int | None = None  # index into samples of the sample taken by the previous read

    def serves(self, quantity: str) -> bool:
        return quantity in self.quantities


@dataclass(slots=True)
class Gpu:
    """One GPU: its handle, the static facts read at start-up, and what successive reads need to remember."""

    index: int
    handle: Any
    uuid: str = ""
    model: str = ""
    pci_bus_id: str | None = None
    max_sm_clock_hertz: float | None = None
    max_memory_clock_hertz: float | None = None
    slowdown_temperature_celsius: float | None = None
    pcie_link_generation_max: int | None = None
    pcie_link_width_max: int | None = None
    mig_enabled: bool | None = None
    mig_slots: int = 0
    links: int = 0
    remote_pci_bus_ids: tuple[str | None, ...] = ()
    fields: tuple[tuple[int, int], ...] = ()
    fields_choice: tuple[bool, frozenset[int]] | None = None  # what ``fields`` was built for (gpulens.exporter.nvml)
    lost: bool = False
    rates: CounterRates = field(default_factory=CounterRates)
    # link -> (when read, NVML state); link states change rarely and cost one call per link, so they are cached.
    link_states: dict[int, tuple[float, Any]] = field(default_factory=dict)
    gpm: GpmState | None = None  # where GPM serves this GPU (gpulens.exporter.nvmlgpm)
    # NVLink error fields whose all-links total the driver refuses (Hopper may): summed over links instead, with the
    # sums cached as field id -> (when read, sum).
    nvlink_errors_per_link: set[int] = field(default_factory=set)
    link_errors: dict[int, tuple[float, int | None]] = field(default_factory=dict)
    # (when read, values) of what changes rarely, and of the MIG layout; reused for ``SLOW_REFRESH_S``.
    slow: tuple[float, SlowValues] | None = None
    mig_layout: tuple[float, tuple[MigIdentity, ...]] | None = None

    def fresh(self, read_at: float | None, now: float) -> bool:
        """Whether something read at monotonic time ``read_at`` may still be reused at ``now``."""
        return read_at is not None and 0 <= now - read_at < SLOW_REFRESH_S
