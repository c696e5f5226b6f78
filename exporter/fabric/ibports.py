"""RDMA ports: every port of every InfiniBand or RoCE device under ``<root>/sys/class/infiniband``.

Per port ``<root>/sys/class/infiniband/<device>/ports/<port>/`` the reader takes ``state`` ("4: ACTIVE"),
``phys_state`` ("5: LinkUp"), ``rate`` ("400 Gb/sec (4X NDR)", signalling rate in gigabits), ``link_layer``
("InfiniBand" or "Ethernet" for RoCE), the standard PortCounters under ``counters/`` and, where the driver has
them (mlx5), the vendor ``hw_counters/``; per device the PCI address (``device`` symlink) and ``numa_node``.

Assumptions about the counters, as the kernel's ``Documentation/ABI/stable/sysfs-class-infiniband`` describes them:

* ``port_xmit_data``/``port_rcv_data`` count 4-byte words (octets divided by 4): they are multiplied by 4.
* Since Linux 4.5 the data and packet files in ``counters/`` carry the 64-bit PortCountersExtended values when the
  HCA supports them (every mlx5 does). Older kernels show the 32-bit PortCounters there and the 64-bit ones in
  ``counters_ext/*_64``, which this reader prefers whenever that directory exists.
* The InfiniBand PortCounters do not wrap: each stops at the all-ones value of its width (32 bits for the legacy
  data, packet and wait counters, 16 for symbol/receive errors and discards, 8 for link downed/recovery, 4 for
  local link integrity and buffer overrun). A counter found at exactly that value is reported in
  ``saturated_counters`` and counted under ``ib_saturated``: it has stopped and its rate reads zero until reset.
  A 64-bit counter passing through 0xFFFFFFFF would be flagged for one read; that is the accepted false positive.

Rates (``transmit_bytes_per_second``, ``receive_bytes_per_second``, ``transmit_wait_per_second``,
``cnp_handled_per_second``) are computed here, at the source, from the previous read of the same port and the injected
clock's monotonic time (``gpulens.counters.counter_rate``): ``None`` on a port's first read, after a counter went down
(a reset) and for a counter listed in ``saturated_counters``.

Nothing here raises: a missing file is ``None``, an unreadable or garbled one ``None`` plus a count in ``errors``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

from gpulens.clock import Clock, SystemClock
from gpulens.counters import counter_rate
from gpulens.exporter.fabric.sysread import AttributeReader
from gpulens.fabricmodel import NicReading, port_is_up
from gpulens.logutil import ErrorCounter

_T = TypeVar("_T")
logger = logging.getLogger(__name__)

WORD_BYTES: Final = 4  # port_xmit_data/port_rcv_data unit: one 4-byte word (per lane, as IBA defines it)

# counters/<file> -> (NicReading field, PortCounters width in bits, multiplier, counters_ext/<file> or None)
COUNTERS: Final[tuple[tuple[str, str, int, int, str | None], ...]] = (
    ("port_xmit_data", "transmit_bytes_total", 32, WORD_BYTES, "port_xmit_data_64"),
    ("port_rcv_data", "receive_bytes_total", 32, WORD_BYTES, "port_rcv_data_64"),
    ("port_xmit_packets", "transmit_packets_total", 32, 1, "port_xmit_packets_64"),
    ("port_rcv_packets", "receive_packets_total", 32, 1, "port_rcv_packets_64"),
    ("port_xmit_wait", "transmit_wait_total", 32, 1, None),
    ("symbol_error", "symbol_errors_total", 16, 1, None),
    ("link_downed", "link_downed_total", 8, 1, None),
    ("link_error_recovery", "link_error_recovery_total", 8, 1, None),
    ("port_rcv_errors", "receive_errors_total", 16, 1, None),
    ("local_link_integrity_errors", "local_link_integrity_errors_total", 4, 1, None),
    ("excessive_buffer_overrun_errors", "excessive_buffer_overrun_errors_total", 4, 1, None),
    ("port_xmit_discards", "transmit_discards_total", 16, 1, None),
)
# hw_counters/<file> -> NicReading field (mlx5; the CNP counters exist on RoCE ports only)
HW_COUNTERS: Final[tuple[tuple[str, str], ...]] = (
    ("np_cnp_sent", "cnp_sent_total"),
    ("rp_cnp_handled", "cnp_handled_total"),
    ("out_of_sequence", "out_of_sequence_total"),
    ("packet_seq_err", "packet_sequence_errors_total"),
    ("local_ack_timeout_err", "local_ack_timeouts_total"),
)

_STATE: Final = re.compile(r"\d+:\s*(\S.*)")
_RATE: Final = re.compile(r"(\d+(?:\.\d+)?) Gb/sec(?: \((\d+)X(?: (\w+))?\))?")
_PCI_ADDRESS: Final = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_BITS_PER_BYTE: Final = 8
_GIGA: Final = 1e9


def parse_state(text: str) -> str | None:
    """``"4: ACTIVE"`` -> ``"ACTIVE"``; ``None`` when it is not ``<id>: <name>``."""
    match = _STATE.fullmatch(text)
    return None if match is None else match.group(1).strip()


def parse_rate(text: str) -> tuple[float, int | None, str | None] | None:
    """``"400 Gb/sec (4X NDR)"`` -> ``(50e9, 4, "NDR")``: bytes per second, lanes, lane speed; ``None`` if garbled."""
    match = _RATE.fullmatch(text)
    if match is None:
        return None
    gigabits, width, speed = match.groups()
    return float(gigabits) * _GIGA / _BITS_PER_BYTE, None if width is None else int(width), speed


@dataclass(frozen=True, slots=True)
class _Device:
    directory: str
    pci_bus_id: str | None
    numa_node: int | None


def _natural(name: str) -> tuple[str, int]:
    """Sort key putting ``mlx5_2`` before ``mlx5_10``."""
    stem = name.rstrip("0123456789")
    digits = name[len(stem) :]
    return (stem, int(digits) if digits else -1)


def with_rates(reading: NicReading, previous: NicReading | None, elapsed_seconds: float | None) -> NicReading:
    """``reading`` with its per-second rates since ``previous`` (the same port's last read), ``elapsed_seconds`` ago.

    A counter listed in ``saturated_counters`` (by its file name in ``counters/``) has no rate.
    """

    def rate(field: str, counter_file: str | None) -> float | None:
        if previous is None or (counter_file is not None and counter_file in reading.saturated_counters):
            return None
        return counter_rate(getattr(previous, field), getattr(reading, field), elapsed_seconds)

    return dataclasses.replace(
        reading,
        transmit_bytes_per_second=rate("transmit_bytes_total", "port_xmit_data"),
        receive_bytes_per_second=rate("receive_bytes_total", "port_rcv_data"),
        transmit_wait_per_second=rate("transmit_wait_total", "port_xmit_wait"),
        cnp_handled_per_second=rate("cnp_handled_total", None),
    )


class IbPortReader:
    """Reads every RDMA port of the node; ``root`` is the filesystem root sysfs hangs from (``/`` on a host).

    The reader remembers each port's previous reading and its time (``clock.monotonic()``) for the rates.
    """

    def __init__(
        self, node: str, *, root: str = "/", reader: AttributeReader | None = None, clock: Clock | None = None
    ) -> None:
        self.node = node
        self._class_dir = os.path.join(root, "sys", "class", "infiniband")
        self._reader = reader if reader is not None else AttributeReader("ib", ErrorCounter(logger))
        self._clock = clock if clock is not None else SystemClock()
        self._devices: dict[tuple[str, str], _Device] = {}
        self._previous: dict[tuple[str, int], tuple[float, NicReading]] = {}

    @property
    def errors(self) -> Mapping[str, int]:
        """Cumulative failure counts by reason (``ib_malformed``, ``ib_read_error``, ``ib_saturated``, ...)."""
        return self._reader.errors

    def read(self) -> tuple[NicReading, ...]:
        """One reading per port, ordered by device then port; ``()`` on a node without RDMA devices."""
        now = self._clock.monotonic()
        readings: list[NicReading] = []
        previous = self._previous
        self._previous = {}  # a port that disappeared (driver unloaded) starts afresh when it comes back
        for name in sorted(self._list(self._class_dir), key=_natural):
            device = self._device(name)
            ports_dir = os.path.join(device.directory, "ports")
            for port in sorted(int(entry) for entry in self._list(ports_dir) if entry.isdigit()):
                path = os.path.join(ports_dir, str(port))
                reading = self._read_port(name, port, path, device.pci_bus_id, device.numa_node)
                before = previous.get((name, port))
                if before is None:
                    reading = with_rates(reading, None, None)
                else:
                    reading = with_rates(reading, before[1], now - before[0])
                self._previous[(name, port)] = (now, reading)
                readings.append(reading)
        return tuple(readings)

    def _list(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []
        except OSError as exc:
            self._reader.count("read_error", "cannot list %s: %s", path, exc)
            return []

    def _device(self, device: str) -> _Device:
        """The device's real directory, PCI address and NUMA node, resolved once per device and symlink target.

        ``sys/class/infiniband/<device>`` is a symlink into ``sys/devices``: resolving it once spares every
        attribute read the walk, and keying the cache by the link's target notices a name that moved to another
        PCI function after a driver reload.
        """
        entry = os.path.join(self._class_dir, device)
        try:
            target = os.readlink(entry)
        except OSError:  # not a symlink (or just gone): read through the entry itself
            target = ""
        key = (device, target)
        if key not in self._devices:
            link = os.path.join(entry, "device")
            name = os.path.basename(os.path.realpath(link)) if os.path.exists(link) else ""
            numa = self._reader.integer(os.path.join(link, "numa_node"), signed=True)
            self._devices = {k: v for k, v in self._devices.items() if k[0] != device}
            self._devices[key] = _Device(
                directory=os.path.realpath(entry),
                pci_bus_id=name if _PCI_ADDRESS.fullmatch(name) else None,
                numa_node=None if numa is None or numa < 0 else numa,
            )
        return self._devices[key]

    def _read_port(
        self, device: str, port: int, path: str, pci_bus_id: str | None, numa_node: int | None
    ) -> NicReading:
        text = self._reader.text
        state = self._parsed(os.path.join(path, "state"), parse_state, "'<id>: <STATE>'")
        phys_state = self._parsed(os.path.join(path, "phys_state"), parse_state, "'<id>: <PhysState>'")
        rate = self._parsed(os.path.join(path, "rate"), parse_rate, "'<n> Gb/sec (<w>X <SPEED>)'")
        values: dict[str, int | None] = {}
        saturated: list[str] = []
        has_ext = os.path.isdir(os.path.join(path, "counters_ext"))
        for name, field, width, multiplier, ext_name in COUNTERS:
            value = None
            if has_ext and ext_name is not None:
                value = self._reader.integer(os.path.join(path, "counters_ext", ext_name))
            if value is None:
                value = self._reader.integer(os.path.join(path, "counters", name))
                if value is not None and value == (1 << width) - 1:
                    saturated.append(name)
            values[field] = None if value is None else value * multiplier
        for name, field in HW_COUNTERS:
            values[field] = self._reader.integer(os.path.join(path, "hw_counters", name))
        if saturated:
            self._reader.count(
                "saturated", "%s port %d: counters stopped at their maximum: %s", device, port, ", ".join(saturated)
            )
        return NicReading(
            node=self.node,
            device=device,
            port=port,
            link_layer=text(os.path.join(path, "link_layer")) or None,
            state=state,
            phys_state=phys_state,
            up=port_is_up(state, phys_state),
            rate_bytes_per_second=None if rate is None else rate[0],
            link_width=None if rate is None else rate[1],
            link_speed=None if rate is None else rate[2],
            saturated_counters=tuple(saturated),
            pci_bus_id=pci_bus_id,
            numa_node=numa_node,
            gpus=(),
            **values,
        )

    def _parsed(self, path: str, parse: Callable[[str], _T | None], expected: str) -> _T | None:
        raw = self._reader.text(path)
        if raw is None:
            return None
        value = parse(raw)
        if value is None:
            self._reader.malformed(path, expected)
        return value
