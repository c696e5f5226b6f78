"""Fabric and host records: the RDMA ports, the host and each job's share of the host, beside the GPUs.

The other half of a training job's communication leaves the node through InfiniBand or RoCE ports, and its input
pipeline runs on the host's CPUs and memory. These are the records the node agent's fabric and host readers
(``exporter/fabric/``) produce, one per RDMA port, one per node and one per job, with the same rules as
``gpulens.model``: units converted once at the source (bytes, bytes per second, seconds, 0-1 ratios, CPU cores),
counters as cumulative ``*_total`` values exactly as the hardware reports them, and ``None`` for anything unknown.

The readers that fill them are described in docs/fabric.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

LINK_LAYER_INFINIBAND: Final = "InfiniBand"
LINK_LAYER_ETHERNET: Final = "Ethernet"  # RoCE: RDMA over Converged Ethernet
PORT_STATE_ACTIVE: Final = "ACTIVE"
PORT_PHYS_STATE_LINK_UP: Final = "LinkUp"


def port_is_up(state: str | None, phys_state: str | None) -> bool:
    """A port carries traffic when its logical state is ACTIVE and its physical state is LinkUp."""
    return state == PORT_STATE_ACTIVE and phys_state == PORT_PHYS_STATE_LINK_UP


def nic_id(node: str, device: str, port: int) -> str:
    """The one string that names a port everywhere a key must be a string (series keys, URLs): ``node/device/port``."""
    return f"{node}/{device}/{port}"


def parse_nic_id(text: str) -> tuple[str, str, int] | None:
    """``(node, device, port)`` from :func:`nic_id`'s string, ``None`` if it is not one."""
    parts = text.rsplit("/", 2)
    if len(parts) != 3 or not all(parts) or not parts[2].isdigit():
        return None
    return (parts[0], parts[1], int(parts[2]))


@dataclass(frozen=True, slots=True)
class NicReading:
    """One port of one RDMA device (an InfiniBand HCA port or a RoCE Ethernet port) at one instant.

    ``rate_bytes_per_second`` is the active signalling rate the port negotiated (``rate``: "400 Gb/sec (4X NDR)"
    is 50e9 bytes/s); ``link_width`` its lanes (4) and ``link_speed`` the per-lane speed name (``"NDR"``), both
    ``None`` when the kernel does not say. There is no port maximum in sysfs; the negotiated rate is the ceiling.

    Byte counters are bytes (the kernel's ``port_xmit_data``/``port_rcv_data`` count 4-byte words; the reader
    multiplies by 4). ``saturated_counters`` names the counters that stand at the all-ones value of their
    InfiniBand PortCounters width (e.g. 0xFFFFFFFF for a legacy 32-bit data counter, 0xFFFF for ``symbol_error``):
    such a counter has stopped counting and its rate reads as zero until it is reset.

    ``pci_bus_id`` (``"0000:17:00.0"``) and ``numa_node`` place the NIC; ``gpus`` lists the indices of the GPUs it
    is nearest to (same PCIe switch, else same NUMA node), filled in by the affinity map, empty until then.
    """

    node: str
    device: str
    port: int
    link_layer: str | None = None
    state: str | None = None
    phys_state: str | None = None
    up: bool = False
    rate_bytes_per_second: float | None = None
    link_width: int | None = None
    link_speed: str | None = None
    transmit_bytes_total: int | None = None
    receive_bytes_total: int | None = None
    transmit_packets_total: int | None = None
    receive_packets_total: int | None = None
    transmit_wait_total: int | None = None
    symbol_errors_total: int | None = None
    link_downed_total: int | None = None
    link_error_recovery_total: int | None = None
    receive_errors_total: int | None = None
    local_link_integrity_errors_total: int | None = None
    excessive_buffer_overrun_errors_total: int | None = None
    transmit_discards_total: int | None = None
    cnp_sent_total: int | None = None
    cnp_handled_total: int | None = None
    out_of_sequence_total: int | None = None
    packet_sequence_errors_total: int | None = None
    local_ack_timeouts_total: int | None = None
    saturated_counters: tuple[str, ...] = ()
    # Per-second rates of the counters above since the previous read of the same port, computed once at the source
    # (``None`` on the first read, after a counter reset or for a saturated counter). ``transmit_wait_per_second``
    # is in the port's own wait ticks per second; ``cnp_handled_per_second`` is RoCE congestion notifications the
    # port reacted to (it was told to slow down).
    transmit_bytes_per_second: float | None = None
    receive_bytes_per_second: float | None = None
    transmit_wait_per_second: float | None = None
    cnp_handled_per_second: float | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    gpus: tuple[int, ...] = ()

    @property
    def key(self) -> tuple[str, str, int]:
        """What names one port across readings: (node, device, port)."""
        return (self.node, self.device, self.port)

    @property
    def id(self) -> str:
        """:func:`nic_id` of this port."""
        return nic_id(self.node, self.device, self.port)

    @property
    def is_roce(self) -> bool:
        return self.link_layer == LINK_LAYER_ETHERNET


@dataclass(frozen=True, slots=True)
class HostReading:
    """The node's CPUs and memory at one instant.

    ``cpu_busy_ratio`` is the share of all CPU time since the previous read spent neither idle nor waiting for I/O;
    ``cpu_iowait_ratio`` the share spent idle with I/O outstanding. Both are ``None`` on the first read (a ratio
    needs two samples) and whenever no CPU time elapsed. ``memory_used_bytes`` is total minus available: what
    the kernel could not hand to a new allocation without swapping.
    """

    node: str
    cpus: int | None = None
    cpu_busy_ratio: float | None = None
    cpu_iowait_ratio: float | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_available_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class JobHostReading:
    """One job's share of the host, from its control group, at one instant.

    ``cpu_seconds_total`` is the CPU time the job's processes have used since the cgroup was created;
    ``cpu_limit_cores`` its CPU bandwidth limit in cores (quota / period), ``None`` when unlimited.
    ``memory_used_bytes`` is the cgroup's charged memory (page cache included, as the kernel accounts it);
    ``memory_limit_bytes`` its hard limit, ``None`` when unlimited. ``cgroup`` is the job's cgroup path (relative
    to the hierarchy's mount point) and ``cgroup_version`` 1 or 2.
    """

    node: str
    job_id: str
    cgroup: str | None = None
    cgroup_version: int | None = None
    cpu_seconds_total: float | None = None
    cpu_limit_cores: float | None = None
    memory_used_bytes: int | None = None
    memory_limit_bytes: int | None = None
    # CPU cores the job used on average since the previous read (the rate of ``cpu_seconds_total``); None at first.
    cpu_used_cores: float | None = None
