"""The node's own checks: ``JobInputBound``, a job whose GPUs wait on its host (a CPU-starved data loader, or memory
pressure and iowait), and ``GpuDriverHung``, a node whose NVML calls do not return.

A pure check like the others (``alerts.checks``): the job's GPUs are mostly idle after it had been busy, and on one
of its nodes its cgroup uses its whole CPU share or the node waits on I/O. A checkpoint also idles the GPUs while the
host works, but it writes: while the job's NICs (or its GPUs over PCIe) send more than they receive, at checkpoint
rates, the rule holds its judgement instead of counting the round.
"""

from __future__ import annotations

from gpulens.alerts.base import AlertRule, Candidate, percent, rate_text, rule_labels
from gpulens.alerts.history import History, JobView
from gpulens.config import format_duration
from gpulens.fabricmodel import HostReading, JobHostReading


def _starved(rule: AlertRule, share: JobHostReading | None, host: HostReading | None) -> list[str]:
    """What starves the job on one node: its cgroup's CPU at its limit, or the node's iowait."""
    out = []
    if share is not None and share.cpu_used_cores is not None:
        limit = share.cpu_limit_cores or (float(host.cpus) if host is not None and host.cpus else None)
        if limit and share.cpu_used_cores >= rule.threshold("cpu_saturated_ratio") * limit:
            kind = "limit" if share.cpu_limit_cores else "node's"
            out.append(f"cgroup CPU {share.cpu_used_cores:.1f} of its {kind} {limit:g} cores")
    if (
        host is not None
        and host.cpu_iowait_ratio is not None
        and host.cpu_iowait_ratio >= rule.threshold("iowait_ratio")
    ):
        text = f"iowait {percent(host.cpu_iowait_ratio)}"
        if host.memory_available_bytes is not None and host.memory_total_bytes:
            available = host.memory_available_bytes / host.memory_total_bytes
            if available < rule.threshold("memory_available_ratio_min"):
                text += f" with {available * 100:.1f}% memory available (memory pressure)"
        out.append(text)
    return out


def _writing(rule: AlertRule, history: History, view: JobView, gpus: dict[str, list[int]]) -> bool:
    """The job writes at checkpoint rates (out over its NICs, or out of its GPUs over PCIe) more than it reads."""
    floor = rule.threshold("checkpoint_write_bytes_per_second")
    nics = history.fabric.job_nics(gpus)
    tx = sum(n.transmit_bytes_per_second or 0.0 for n in nics)
    rx = sum(n.receive_bytes_per_second or 0.0 for n in nics)
    if tx >= floor and tx > rx:
        return True
    latest = history.latest
    assert latest is not None
    readings = [r for uuid in view.gpus if (r := latest.gpus.get(uuid)) is not None and r.up]
    out = sum(r.pcie_tx_bytes_per_second or 0.0 for r in readings)
    into = sum(r.pcie_rx_bytes_per_second or 0.0 for r in readings)
    return out >= floor and out > into


def job_input_bound(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    latest = history.latest
    if latest is None:
        return []
    out = []
    for job_id, view in latest.jobs.items():
        rounds = history.job_rounds(job_id)
        summary = rounds[-1] if rounds and rounds[-1].time == latest.time else None
        if summary is None or summary.utilization_median is None:
            continue
        if summary.utilization_median > rule.threshold("utilization_max") or history.job_last_busy(job_id) is None:
            continue
        gpus: dict[str, list[int]] = {}
        for uuid in view.gpus:
            if (reading := latest.gpus.get(uuid)) is not None:
                gpus.setdefault(reading.node, []).append(reading.gpu)
        shares = {s.node: s for s in history.fabric.job_hosts(job_id)}
        starved = {
            node: found
            for node in sorted(gpus)
            if (found := _starved(rule, shares.get(node), history.fabric.host(node)))
        }
        if not starved:
            continue
        if _writing(rule, history, view, gpus):
            out.append(Candidate(rule.name, {"job_id": job_id}, None, "", "", hold=True))  # a checkpoint
            continue
        nodes = ",".join(sorted(gpus))
        labels = rule_labels(rule, {"node": nodes, "job_id": job_id, "user": view.user or "", "job": job_id})
        causes = "; ".join(f"{node} {', '.join(found)}" for node, found in starved.items())
        util = summary.utilization_median
        text = f"job {job_id}: {summary.gpus} GPUs at {percent(util)} waiting on the host: {causes}"
        nics = history.fabric.job_nics(gpus)
        moved = sum(max(n.transmit_bytes_per_second or 0.0, n.receive_bytes_per_second or 0.0) for n in nics)
        fabric = f" Its NICs move {rate_text(moved)}." if nics else ""
        description = (
            f"The job's GPUs are mostly idle (median utilization {percent(util)}) after it had been busy, while its "
            f"host starves it ({causes}): the GPUs wait for input, not for the network.{fabric}"
            + (f" User {view.user}." if view.user else "")
        )
        out.append(Candidate(rule.name, labels, util, text, description))
    return out


def gpu_driver_hung(rule: AlertRule, history: History, now: float) -> list[Candidate]:
    """A node whose exporter answers but says an NVML call passed its deadline (``nvml_hung_since``)."""
    latest = history.latest
    if latest is None:
        return []
    out = []
    for node, since in sorted(latest.nvml_hung.items()):
        held = f" for {format_duration(now - since)}" if now > since else ""
        summary = f"node {node}: the GPU driver is hung: an NVML call has not returned{held}"
        description = (
            "An NVML call on this node passed its deadline: the driver is wedged. The exporter still answers, with "
            "the node's other readings; its GPU readings are stale (served with their age) or withdrawn."
        )
        out.append(Candidate(rule.name, rule_labels(rule, {"node": node}), None, summary, description))
    return out
