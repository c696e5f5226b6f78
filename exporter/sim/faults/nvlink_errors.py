"""Fault kind ``nvlink_errors``: a GPU's NVLink CRC, replay and recovery error counters climb."""

from __future__ import annotations

from typing import Final

from gpulens.exporter.sim.faults.kind import FaultCheckError, FaultKind, GpuFaultParams, ScenarioView
from gpulens.exporter.sim.specs import FaultSpec, JobSpec
from gpulens.exporter.sim.stepstate import Counters

NVLINK_CRC_PER_S: Final = 250.0
NVLINK_REPLAY_PER_S: Final = 12.0
NVLINK_RECOVERY_PER_S: Final = 0.2


class NvlinkErrorsParams(GpuFaultParams, frozen=True, tag="nvlink_errors"):
    """``gpu``, ``at``, ``duration``."""


class NvlinkErrors(FaultKind):
    name = "nvlink_errors"
    params = NvlinkErrorsParams
    target = "gpu"

    def check(self, fault: FaultSpec, job: JobSpec | None, scenario: ScenarioView) -> None:
        assert fault.gpu is not None
        model = scenario.nodes[fault.gpu.node].model
        if not model.has_nvlink:
            raise FaultCheckError("gpu", f"{fault.gpu} is a {model.name}: it has no NVLink")

    def count(self, fault: FaultSpec, elapsed_s: float, counters: Counters) -> None:
        counters.nvlink_crc += int(NVLINK_CRC_PER_S * elapsed_s)
        counters.nvlink_replay += int(NVLINK_REPLAY_PER_S * elapsed_s)
        counters.nvlink_recovery += int(NVLINK_RECOVERY_PER_S * elapsed_s)
