"""NCCL's Inspector in the simulator: the bus bandwidth each training job's ranks measure, and the files they write.

A training job with ``nccl_inspector = true`` (two GPUs or more) runs one AllReduce of ``MESSAGE_BYTES`` per rank and
step while it trains (none through warm-up, checkpoints, evaluation and data-loader waits). Its healthy bus bandwidth
is what its slowest links carry: ``NIC_BUS_BYTES_PER_SECOND`` across nodes (one 400 Gb/s port per GPU, ~90 % of it),
``NVLINK_BUS_BYTES_PER_SECOND`` within one node; each rank's measure varies by ``NOISE`` around it.

Three faults lower it for every rank of the job: ``fabric_congestion`` to its pace (a third), ``ib_degraded`` on a
port the job crosses to the port's share (half), and ``straggler`` to the straggler's pace (the others wait for it
inside each collective). The ranks where the cause sits measure ``AT_THE_SLOW_LINK`` of that again: those next to
the degraded port, and the straggler itself (its reduction kernels run at its lowered clock), so the per-rank data
points at them. Nothing else changes it.

``view`` gives a node's agent view (``gpulens.ncclinspect.summarise``, the agent's own summary) in virtual time;
``write_json`` appends the same records to ``<dir>/<job>/<node>-pid<pid>.log`` in the Inspector's JSON-lines format,
which a live exporter's ``--nccl-inspector-dir`` then reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Final

from gpulens.exporter.sim import noise
from gpulens.exporter.sim.faults.fabric_congestion import CONGESTED_PACE
from gpulens.exporter.sim.faults.ib_degraded import DEGRADED_RATE_SHARE
from gpulens.exporter.sim.faults.straggler import STRAGGLER_SLOWDOWN
from gpulens.exporter.sim.specs import FaultSpec, GpuRef, JobSpec
from gpulens.exporter.sim.stepstate import RUN, JobPhase
from gpulens.ncclinspect import BYTES_PER_GB, InspectorRecord, InspectorView, summarise

MESSAGE_BYTES: Final = 256 << 20
NIC_BUS_BYTES_PER_SECOND: Final = 45e9
NVLINK_BUS_BYTES_PER_SECOND: Final = 360e9
NOISE: Final = 0.03
AT_THE_SLOW_LINK: Final = 0.85  # the ranks where the cause sits, of what the others measure
SLOWING_KINDS: Final = ("fabric_congestion", "ib_degraded", "straggler")
HOLD_S: Final = 300.0  # the agent's reader keeps a series this long (gpulens.exporter.inspectorread)


class InspectorSim:
    """The Inspector records of every training job that runs it."""

    def __init__(
        self,
        jobs: list[JobSpec],
        faults: list[FaultSpec],
        phase: Callable[[str, int], JobPhase | None],
        pids: Callable[[GpuRef], Mapping[str, int]],
        uuid: Callable[[GpuRef], str],
        nic_gpus: Callable[[str, str], tuple[int, ...]],
        *,
        seed: int,
        step_s: float,
    ) -> None:
        self._jobs = [j for j in jobs if j.kind == "training" and len(j.gpus) >= 2 and j.nccl_inspector]
        self._nic_gpus = nic_gpus
        self._faults = {j.id: [f for f in faults if self._hits(f, j)] for j in self._jobs}
        self._phase = phase
        self._pids = pids
        self._uuid = uuid
        self._seed = seed
        self._step = step_s

    def _beside(self, f: FaultSpec, ref: GpuRef) -> bool:
        """Whether the GPU sits next to the port a fabric fault names."""
        return f.node == ref.node and f.nic is not None and ref.index in self._nic_gpus(ref.node, f.nic)

    def _hits(self, f: FaultSpec, job: JobSpec) -> bool:
        if f.kind not in SLOWING_KINDS:
            return False
        if f.job == job.id or job.id in f.jobs_hit:
            return True
        spans = len({ref.node for ref in job.gpus}) > 1  # a port fault slows the jobs that cross it
        return f.kind != "straggler" and spans and any(self._beside(f, ref) for ref in job.gpus)

    @property
    def active(self) -> bool:
        return bool(self._jobs)

    def _comm(self, job: JobSpec) -> str:
        return f"0x{int(noise.unit(self._seed, 'inspector-comm', job.id) * (1 << 56)) | 1:x}"

    def _measured_at(self, job: JobSpec, k: int, t: float) -> int | None:
        """The step whose collectives the agent shows at step ``k``: ``k`` while the job trains, else its last
        training step within ``HOLD_S`` (the agent keeps a series it read that long), else None."""
        if not job.running(t):
            return None
        for back in range(round(HOLD_S / self._step) + 1):
            phase = self._phase(job.id, k - back)
            if phase is not None and phase.mode == RUN:
                return k - back
            if t - back * self._step < job.start:
                return None
        return None

    def records(self, node: str, k: int, t: float, *, held: bool = True) -> list[InspectorRecord]:
        """What the ranks on ``node`` measured at step ``k`` (time ``t``); ``held``: or last measured within
        ``HOLD_S``, as the agent's view keeps it (``write_json`` writes only what step ``k`` measured)."""
        out: list[InspectorRecord] = []
        for job in self._jobs:
            if all(ref.node != node for ref in job.gpus):
                continue
            at = self._measured_at(job, k, t)
            if at is None or (not held and at != k):
                continue
            when = t - (k - at) * self._step
            multi = len({ref.node for ref in job.gpus}) > 1
            healthy = NIC_BUS_BYTES_PER_SECOND if multi else NVLINK_BUS_BYTES_PER_SECOND
            n = len(job.gpus)
            for rank, ref in enumerate(job.gpus):
                if ref.node != node:
                    continue
                jitter = 1 + NOISE * (2 * noise.unit(self._seed, "insp", job.id, at, rank) - 1)
                bus = healthy * self._share(job, ref, when) * jitter
                out.append(
                    InspectorRecord(
                        comm=self._comm(job),
                        collective="AllReduce",
                        size_bytes=MESSAGE_BYTES,
                        bus_bytes_per_second=bus,
                        seconds=MESSAGE_BYTES * 2 * (n - 1) / n / bus,
                        rank=rank,
                        pid=self._pids(ref).get(job.id),
                        job_id=job.id,
                        gpu=self._uuid(ref),
                    )
                )
        return out

    def _share(self, job: JobSpec, ref: GpuRef, t: float) -> float:
        share = 1.0
        for f in self._faults[job.id]:
            if not f.active(t):
                continue
            if f.kind == "fabric_congestion":
                share = min(share, CONGESTED_PACE)
            elif f.kind == "ib_degraded":
                share = min(share, DEGRADED_RATE_SHARE * (AT_THE_SLOW_LINK if self._beside(f, ref) else 1.0))
            elif f.kind == "straggler":
                share = min(share, STRAGGLER_SLOWDOWN * (AT_THE_SLOW_LINK if f.gpu == ref else 1.0))
        return share

    def view(self, node: str, k: int, t: float) -> InspectorView | None:
        """The node agent's view at step ``k``: None where no job of the node runs the Inspector."""
        if not any(ref.node == node for j in self._jobs for ref in j.gpus):
            return None
        records = self.records(node, k, t)
        series, dropped = summarise(records)
        return InspectorView(files=len({r.pid for r in records}), records=len(records), series=tuple(series),
                             dropped_series=dropped)  # fmt: skip

    def write_json(self, directory: str, node: str, k: int, t: float) -> int:
        """Append the step's records as the Inspector's JSON lines under ``directory``; the lines written."""
        written = 0
        for r in self.records(node, k, t, held=False):
            folder = os.path.join(directory, r.job_id or "unknown")
            os.makedirs(folder, exist_ok=True)
            line = {
                "header": {"id": r.comm, "rank": r.rank, "n_ranks": 0, "nnodes": 0},
                "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "", "rec_mechanism":
                             "nccl_profiler_interface", "dump_timestamp_us": int(t * 1e6), "hostname": node,
                             "pid": r.pid},
                "coll_perf": {"coll": r.collective, "coll_sn": k, "coll_msg_size_bytes": r.size_bytes,
                              "coll_exec_time_us": round(r.seconds * 1e6), "coll_timing_source": "kernel_gpu",
                              "coll_algobw_gbs": 0.0, "coll_busbw_gbs": r.bus_bytes_per_second / BYTES_PER_GB},
            }  # fmt: skip
            with open(os.path.join(folder, f"{node}-pid{r.pid}.log"), "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line, separators=(",", ":")) + "\n")
            written += 1
        return written
