"""The fabric and host families of /metrics: RDMA ports (``gpulens_nic_*``), the node (``gpulens_host_*``) and each
job's cgroup (``gpulens_job_*``), rendered from a snapshot's ``nics``, ``host`` and ``job_hosts``.

Same rules as the GPU families (``gpulens.exporter.metrics``): base units in the names, counters exactly as the hardware
reports them (bytes for the 4-byte-word data counters), an unknown value omitted rather than exported as 0. Every
``gpulens_nic_*`` series carries ``node, device, port``; ``gpulens_nic_info`` adds ``link_layer``, ``gpus`` (the
indices of the nearest GPUs, ``"4,5"``) and ``pci_bus_id``. Job series are labelled ``node, job_id`` like
``gpulens_gpu_job_info`` (a ``job`` label would collide with Prometheus's own target label).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from gpulens.exporter.promfamily import Family, render_labels
from gpulens.model import NodeSnapshot

NIC_LABELS: Final = ("node", "device", "port")

# NicReading field -> (family, help); counters, in the order they are rendered
NIC_COUNTERS: Final[tuple[tuple[str, str, str], ...]] = (
    ("transmit_bytes_total", "gpulens_nic_transmit_bytes_total", "Bytes the port sent (port_xmit_data x 4)."),
    ("receive_bytes_total", "gpulens_nic_receive_bytes_total", "Bytes the port received (port_rcv_data x 4)."),
    ("transmit_packets_total", "gpulens_nic_transmit_packets_total", "Packets the port sent."),
    ("receive_packets_total", "gpulens_nic_receive_packets_total", "Packets the port received."),
    (
        "transmit_wait_total",
        "gpulens_nic_transmit_wait_total",
        "Ticks the port had data to send but no flow-control credits (port_xmit_wait): congestion.",
    ),
    ("symbol_errors_total", "gpulens_nic_symbol_errors_total", "Minor link errors detected on a lane."),
    ("link_downed_total", "gpulens_nic_link_downed_total", "Times the link went down after training failed."),
    (
        "link_error_recovery_total",
        "gpulens_nic_link_error_recovery_total",
        "Times the link recovered from errors by retraining.",
    ),
    ("receive_errors_total", "gpulens_nic_receive_errors_total", "Received packets with errors."),
    (
        "local_link_integrity_errors_total",
        "gpulens_nic_local_link_integrity_errors_total",
        "Times local physical errors exceeded the link's threshold.",
    ),
    (
        "excessive_buffer_overrun_errors_total",
        "gpulens_nic_excessive_buffer_overrun_errors_total",
        "Times consecutive flow-control update periods overran the receive buffer.",
    ),
    (
        "transmit_discards_total",
        "gpulens_nic_transmit_discards_total",
        "Outbound packets discarded (port down, congestion).",
    ),
    ("cnp_sent_total", "gpulens_nic_cnp_sent_total", "RoCE congestion notification packets the port sent."),
    (
        "cnp_handled_total",
        "gpulens_nic_cnp_handled_total",
        "RoCE congestion notification packets the port reacted to (told to slow down).",
    ),
    ("out_of_sequence_total", "gpulens_nic_out_of_sequence_total", "Out-of-sequence packets received (mlx5)."),
    (
        "packet_sequence_errors_total",
        "gpulens_nic_packet_sequence_errors_total",
        "NAK sequence errors received: retransmissions (mlx5).",
    ),
    (
        "local_ack_timeouts_total",
        "gpulens_nic_local_ack_timeouts_total",
        "Times the sender's ACK timer expired: retransmissions (mlx5).",
    ),
)

# HostReading / JobHostReading field -> (family, help); gauges
HOST_GAUGES: Final[tuple[tuple[str, str, str], ...]] = (
    ("cpus", "gpulens_host_cpus", "Online CPUs of the node."),
    (
        "cpu_busy_ratio",
        "gpulens_host_cpu_busy_ratio",
        "Share of all CPU time since the previous collection spent neither idle nor in iowait (0-1).",
    ),
    (
        "cpu_iowait_ratio",
        "gpulens_host_cpu_iowait_ratio",
        "Share of all CPU time since the previous collection spent idle waiting for I/O (0-1).",
    ),
    ("memory_total_bytes", "gpulens_host_memory_total_bytes", "The node's memory (MemTotal, bytes)."),
    ("memory_used_bytes", "gpulens_host_memory_used_bytes", "Memory not available to new allocations (bytes)."),
    (
        "memory_available_bytes",
        "gpulens_host_memory_available_bytes",
        "Memory available to new allocations without swapping (MemAvailable, bytes).",
    ),
)
JOB_GAUGES: Final[tuple[tuple[str, str, str], ...]] = (
    ("cpu_limit_cores", "gpulens_job_cpu_limit_cores", "The job cgroup's CPU bandwidth limit in cores (quota/period)."),
    (
        "memory_used_bytes",
        "gpulens_job_memory_used_bytes",
        "Memory charged to the job's cgroup, page cache included (bytes).",
    ),
    ("memory_limit_bytes", "gpulens_job_memory_limit_bytes", "The job cgroup's hard memory limit (bytes)."),
)


def fabric_families(snapshot: NodeSnapshot) -> Iterator[Family]:
    """The ``gpulens_nic_*``, ``gpulens_host_*`` and ``gpulens_job_*`` families of ``snapshot`` (empty ones render
    nothing)."""
    nics = snapshot.nics
    prefixes = [render_labels(NIC_LABELS, (n.node, n.device, str(n.port))) for n in nics]
    info = Family(
        "gpulens_nic_info",
        "RDMA port identity and the GPUs nearest to it (indices, by PCIe switch else NUMA node); always 1.",
        labels=[*NIC_LABELS, "link_layer", "gpus", "pci_bus_id"],
    )
    up = Family("gpulens_nic_up", "1 while the port is ACTIVE and LinkUp, else 0.", labels=NIC_LABELS)
    speed = Family(
        "gpulens_nic_link_speed_bytes_per_second",
        "The rate the port negotiated (bytes per second; 400 Gb/s NDR is 5e10).",
        labels=NIC_LABELS,
    )
    width = Family("gpulens_nic_link_width", "Lanes the port negotiated (1, 2, 4, 8).", labels=NIC_LABELS)
    saturated = Family(
        "gpulens_nic_saturated",
        "1 for a counter stopped at its maximum: it no longer counts until reset, so rate() reads 0.",
        labels=[*NIC_LABELS, "counter"],
    )
    for n, prefix in zip(nics, prefixes, strict=True):
        gpus = ",".join(str(g) for g in n.gpus)
        info.add_rendered(
            prefix
            + ","
            + render_labels(("link_layer", "gpus", "pci_bus_id"), (n.link_layer or "", gpus, n.pci_bus_id or "")),
            1,
        )
        up.add_rendered(prefix, n.up)
        if n.rate_bytes_per_second is not None:
            speed.add_rendered(prefix, n.rate_bytes_per_second)
        if n.link_width is not None:
            width.add_rendered(prefix, n.link_width)
        for counter in n.saturated_counters:
            saturated.add_rendered(prefix + "," + render_labels(("counter",), (counter,)), 1)
    yield from (info, up, speed, width)
    for field, name, help_text in NIC_COUNTERS:
        family = Family(name, help_text, labels=NIC_LABELS, type="counter")
        for n, prefix in zip(nics, prefixes, strict=True):
            value = getattr(n, field)
            if value is not None:
                family.add_rendered(prefix, value)
        yield family
    yield saturated

    host = snapshot.host
    for field, name, help_text in HOST_GAUGES:
        family = Family(name, help_text, labels=("node",))
        value = None if host is None else getattr(host, field)
        if host is not None and value is not None:
            family.add_metric((host.node,), value)
        yield family

    jobs = snapshot.job_hosts
    job_prefixes = [render_labels(("node", "job_id"), (j.node, j.job_id)) for j in jobs]
    cpu = Family(
        "gpulens_job_cpu_seconds_total",
        "CPU time used by the job's cgroup on this node (seconds).",
        labels=("node", "job_id"),
        type="counter",
    )
    for j, prefix in zip(jobs, job_prefixes, strict=True):
        if j.cpu_seconds_total is not None:
            cpu.add_rendered(prefix, j.cpu_seconds_total)
    yield cpu
    for field, name, help_text in JOB_GAUGES:
        family = Family(name, help_text, labels=("node", "job_id"))
        for j, prefix in zip(jobs, job_prefixes, strict=True):
            value = getattr(j, field)
            if value is not None:
                family.add_rendered(prefix, value)
        yield family
