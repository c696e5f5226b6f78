"""The simulator behind the source protocols: one node (``--node``) or every node (``--all-nodes``)."""

from __future__ import annotations

from gpulens.clock import Clock, SystemClock
from gpulens.exporter.sim.cluster import SimCluster, UnknownNodeError
from gpulens.model import NodeSnapshot


class LiveTime:
    """Runs a scenario live: its start is mapped to the moment the exporter starts, and virtual time runs ``speed``
    times faster than the real clock. Readings carry real (wall-clock) timestamps, so a collector, alert rules and
    the dashboard see current data while the scenario's faults arrive ``speed`` times sooner."""

    def __init__(self, scenario_start: float, speed: float = 1.0, clock: Clock | None = None) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self._clock = clock or SystemClock()
        self._start = scenario_start
        self._speed = speed
        self._anchor = self._clock.now()

    def now(self) -> float:
        """The virtual time now."""
        return self._start + (self._clock.now() - self._anchor) * self._speed

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def to_real(self, virtual: float) -> float:
        """The wall-clock time at which the scenario reaches ``virtual``."""
        return self._anchor + (virtual - self._start) / self._speed


class SimSource:
    """A ``GpuSource`` for one simulated node, read at the clock's virtual time."""

    def __init__(self, cluster: SimCluster, node: str, clock: Clock) -> None:
        if node not in cluster.node_names():
            raise UnknownNodeError(node, cluster.node_names())
        self._cluster = cluster
        self._node = node
        self._clock = clock

    @property
    def node(self) -> str:
        return self._node

    def read(self) -> NodeSnapshot:
        """Raises ``NodeUnavailableError`` while an ``exporter_down`` fault covers the node."""
        return self._cluster.snapshot(self._node, self._clock.now())

    def close(self) -> None:
        """Stop the simulated RAS ports, if any; the simulation holds no devices or files."""
        self._cluster.close()


class SimAllNodes:
    """A ``MultiNodeSource`` for every node of the scenario, read at the clock's virtual time."""

    def __init__(self, cluster: SimCluster, clock: Clock) -> None:
        self._cluster = cluster
        self._clock = clock

    def node_names(self) -> list[str]:
        return self._cluster.node_names()

    def read_node(self, node: str) -> NodeSnapshot:
        """Raises ``UnknownNodeError`` for a node the scenario lacks, ``NodeUnavailableError`` for one that is down."""
        return self._cluster.snapshot(node, self._clock.now())

    def close(self) -> None:
        """Stop the simulated RAS ports, if any; the simulation holds no devices or files."""
        self._cluster.close()
