"""The node's hardware against what it should be: NVIDIA GPUs and NVSwitches on the PCI bus, the fabric manager,
``nvidia_peermem``, and the operator's expectation (``--expect-gpus``, ``--expect-ib-ports``,
``--expect-ib-rate-gbps``).

``HardwareReader.enrich`` runs after the fabric reader (it needs the snapshot's RDMA ports) and sets
``snapshot.hardware`` (``gpulens.nodehardware``), keeping each GPU's settings the NVML source put there. What it reads,
under ``root`` (where the host's ``sys/`` and ``run/`` hang) and ``proc_root``:

- ``sys/bus/pci/devices/*/vendor`` and ``class``: vendor ``0x10de`` with class ``0x0300xx`` (VGA/display) or
  ``0x0302xx`` (3D controller) is a GPU; class ``0x0680xx`` (bridge) is an NVSwitch. The bus does not depend on the
  driver, so a GPU NVML cannot open still shows here;
- ``sys/module/nvidia_peermem`` (a directory while the module is loaded), only where the node has RDMA ports;
- on NVSwitch nodes, the fabric manager's PID file (``run/nvidia-fabricmanager/nv-fabricmanager.pid``, the path its
  systemd unit names) and ``<proc_root>/<pid>/comm``; without a PID file, a scan of ``<proc_root>/*/comm``. No
  ``systemctl`` per collection.

The bus, the module and the service are read every ``refresh_s`` (10 s); a GPU missing from the readings is judged
every collection. Nothing here raises: an unreadable file is unknown and counted under ``hardware_*``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Final

from gpulens.clock import Clock, SystemClock
from gpulens.exporter.fabric.sysread import AttributeReader
from gpulens.logutil import ErrorCounter
from gpulens.model import NodeSnapshot
from gpulens.nodehardware import (
    NodeHardware,
    gbps_to_bytes_per_second,
    ib_ports_active,
    ib_ports_slow,
    missing_gpus,
    sysfs_bus_id,
)

logger = logging.getLogger(__name__)

NVIDIA_VENDOR: Final = "0x10de"
GPU_CLASSES: Final = ("0x0300", "0x0302")  # display (VGA compatible) and 3D controller; the last byte varies
NVSWITCH_CLASS: Final = "0x0680"  # bridge, other: how NVSwitch chips enumerate
FABRIC_MANAGER_PID_FILES: Final = (
    "run/nvidia-fabricmanager/nv-fabricmanager.pid",
    "var/run/nvidia-fabricmanager/nv-fabricmanager.pid",
)
FABRIC_MANAGER_COMM: Final = "nv-fabricmanage"  # the kernel keeps 15 characters of a command's name
REFRESH_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class Expectation:
    """What the operator says the node has; ``None``: not said."""

    gpus: int | None = None
    ib_ports: int | None = None
    ib_rate_gbps: float | None = None


@dataclass(frozen=True, slots=True)
class _Bus:
    gpus: tuple[str, ...] | None
    nvswitches: int | None
    fabric_manager_running: bool | None
    peermem_loaded: bool | None


class HardwareReader:
    """Sets each snapshot's ``hardware``; see the module docstring."""

    def __init__(
        self,
        *,
        root: str = "/",
        proc_root: str = "/proc",
        expect: Expectation | None = None,
        clock: Clock | None = None,
        refresh_s: float = REFRESH_S,
    ) -> None:
        self._root = root
        self._proc = proc_root
        self._expect = expect or Expectation()
        self._clock = clock or SystemClock()
        self._refresh_s = refresh_s
        self._reader = AttributeReader("hardware", ErrorCounter(logger))
        self._bus: _Bus | None = None
        self._read_at = 0.0

    @property
    def errors(self) -> Mapping[str, int]:
        return self._reader.errors

    def enrich(self, snapshot: NodeSnapshot) -> NodeSnapshot:
        """The snapshot with ``hardware`` set (its GPU settings kept) and the reader's failure counts added."""
        now = self._clock.monotonic()
        has_rdma = bool(snapshot.nics) or self._listed("sys/class/infiniband") is not None
        if self._bus is None or now - self._read_at >= self._refresh_s:
            self._bus = self._read_bus(has_rdma)
            self._read_at = now
        bus = self._bus
        bus_ids = [g.pci_bus_id for g in snapshot.gpus]
        missing: tuple[str, ...] = ()
        # A source that names no address cannot be compared, nor one whose NVML is hung (its GPUs are unknown, not gone)
        if bus.gpus is not None and all(bus_ids) and snapshot.nvml_hung_since is None:
            missing = missing_gpus(bus.gpus, bus_ids)
        rate = self._expect.ib_rate_gbps
        expected_rate = None if rate is None else gbps_to_bytes_per_second(rate)
        base = snapshot.hardware or NodeHardware()
        hardware = replace(
            base,
            pci_gpus=bus.gpus,
            missing_gpus=missing,
            nvml_gpus=len(snapshot.gpus),
            gpus_expected=self._expect.gpus,
            ib_ports_expected=self._expect.ib_ports,
            ib_rate_expected_bytes_per_second=expected_rate,
            ib_ports_active=ib_ports_active(snapshot.nics),
            ib_ports_slow=ib_ports_slow(snapshot.nics, expected_rate),
            nvswitches=bus.nvswitches,
            fabric_manager_running=bus.fabric_manager_running,
            peermem_loaded=bus.peermem_loaded if has_rdma else None,
        )
        errors = dict(snapshot.errors)
        for reason, count in self.errors.items():
            errors[reason] = errors.get(reason, 0) + count
        return snapshot.replace(hardware=hardware, errors=errors)

    # --- the reads ---------------------------------------------------------------------------------------------

    def _path(self, relative: str) -> str:
        return os.path.join(self._root, relative)

    def _listed(self, relative: str) -> list[str] | None:
        try:
            return sorted(os.listdir(self._path(relative)))
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._reader.count("read_error", "cannot list %s: %s", self._path(relative), exc)
            return None

    def _read_bus(self, has_rdma: bool) -> _Bus:
        devices = self._listed("sys/bus/pci/devices")
        gpus: list[str] = []
        nvswitches = 0
        for name in devices or ():
            where = self._path(os.path.join("sys/bus/pci/devices", name))
            if (self._reader.text(os.path.join(where, "vendor")) or "").lower() != NVIDIA_VENDOR:
                continue
            cls = (self._reader.text(os.path.join(where, "class")) or "").lower()
            if cls[:6] in GPU_CLASSES:
                gpus.append(sysfs_bus_id(name) or name)
            elif cls[:6] == NVSWITCH_CLASS:
                nvswitches += 1
        peermem = os.path.isdir(self._path("sys/module/nvidia_peermem")) if has_rdma else None
        return _Bus(
            gpus=None if devices is None else tuple(sorted(gpus)),
            nvswitches=None if devices is None else nvswitches,
            fabric_manager_running=self._fabric_manager() if nvswitches else None,
            peermem_loaded=peermem,
        )

    def _fabric_manager(self) -> bool:
        for relative in FABRIC_MANAGER_PID_FILES:
            text = self._reader.text(self._path(relative))
            if text is None:
                continue
            if not text.isdigit():
                self._reader.malformed(self._path(relative), "a process id")
                continue
            return self._is_fabric_manager(text)
        try:
            pids = [p for p in os.listdir(self._proc) if p.isdigit()]
        except OSError as exc:
            self._reader.count("read_error", "cannot list %s: %s", self._proc, exc)
            return False
        return any(self._is_fabric_manager(pid) for pid in pids)

    def _is_fabric_manager(self, pid: str) -> bool:
        comm = self._reader.text(os.path.join(self._proc, pid, "comm"))
        return comm is not None and comm.startswith(FABRIC_MANAGER_COMM)
