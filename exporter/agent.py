"""The node agent: build the source, the job mapper, the fabric reader, the poller and the server, then serve until
told to stop."""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final
from urllib.parse import urlsplit

from gpulens.config import ConfigError
from gpulens.exporter.endpoints import Routes, exporter_server
from gpulens.exporter.poller import Enricher, OnDemandNode, Poller
from gpulens.exporter.sidereader import BackgroundEnricher, ReaderState
from gpulens.extras import MissingExtraError, require_k8s
from gpulens.model import GpuSource, NodeSnapshot
from gpulens.netaddr import parse_listen
from gpulens.webconfig import WebConfig, load_web_config

if TYPE_CHECKING:
    from gpulens.exporter.podresources.background import BackgroundLister

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExporterOptions:
    source: str = "auto"
    listen: str = "0.0.0.0:9410"
    interval_s: float = 1.0
    node: str = "localhost"
    node_given: bool = False
    dcgm_url: str = "http://127.0.0.1:9400/metrics"
    dcgm_compat: bool = False
    process_pids: bool = False  # one process memory series per pid (--process-pids), not per job
    user_names: bool = False  # serve user and job names (--user-names; exporter/privacy.py)
    job_map_dir: str | None = None
    job_info: str = "auto"  # "slurm" | "none" | "auto": slurm where squeue is installed
    proc_root: str = "/proc"
    sysfs_root: str = "/"
    fabric: bool = True
    web_config: str | None = None
    scenario: str | None = None
    speed: float = 1.0
    all_nodes: bool = False
    kubelet_socket: str | None = None  # the kubelet's pod-resources socket; None or "": not read
    kubelet_socket_given: bool = False
    nccl_ras: bool = True
    nccl_ras_addr: str = "127.0.0.1:28028"
    nccl_inspector_dir: str | None = None  # where NCCL's Inspector writes; None: not read
    kernel_log: str | None = None  # None: /dev/kmsg where readable (not with --source sim); "": none; else a path
    state_dir: str | None = None  # where XID occurrences outlive restarts; None: memory only
    # What the node should have (--expect-gpus, --expect-ib-ports, --expect-ib-rate-gbps); None: not said.
    expect_gpus: int | None = None
    expect_ib_ports: int | None = None
    expect_ib_rate_gbps: float | None = None


def _nvml_source(options: ExporterOptions) -> GpuSource:
    from gpulens.exporter.nvml import NvmlSource
    from gpulens.exporter.nvmlstart import open_nvml

    # A driver wedged before the start is served as hung (GpuDriverHung), not left as an exporter that never answers.
    return open_nvml(options.node, lambda: NvmlSource(options.node))


def build_routes(options: ExporterOptions) -> tuple[Routes, Poller | None, Callable[[], None]]:
    """The endpoints to serve, the poller to start (None for --all-nodes) and a function that releases the source."""
    if options.all_nodes and options.source != "sim":
        raise ConfigError("--all-nodes needs --source sim", key="--all-nodes")
    readers: dict[str, Callable[[], ReaderState]] = {}  # the side readers' states, shown in /metrics
    side_closers: list[Callable[[], None]] = []
    if options.source == "sim":
        from gpulens.exporter.sim import LiveTime, SimAllNodes, SimCluster, SimSource, load_scenario

        if not options.scenario:
            raise ConfigError("--source sim needs --scenario FILE", key="--scenario")
        scenario = load_scenario(options.scenario)
        clock = LiveTime(scenario.start, options.speed)
        cluster = SimCluster(
            scenario,
            stamp=clock.to_real,
            counter_scale=1 / options.speed,
            nccl_ras=options.nccl_ras,
            ras_over_tcp=not options.all_nodes,  # one node: its RAS on a real port; all nodes: read in process
        )
        if options.all_nodes:
            multi = SimAllNodes(cluster, clock)
            nodes = {
                name: OnDemandNode(
                    multi,
                    name,
                    dcgm_compat=options.dcgm_compat,
                    process_pids=options.process_pids,
                    user_names=options.user_names,
                )
                for name in multi.node_names()
            }
            return Routes(nodes=nodes), None, multi.close
        names = cluster.node_names()
        node = options.node if options.node_given else names[0]
        if node not in names:
            raise ConfigError(f"node {node!r} is not in the scenario (it has {', '.join(names[:5])}...)", key="--node")
        source: GpuSource = SimSource(cluster, node, clock)
        enrichers: list[Enricher] = []
        if options.job_map_dir is not None:  # simulated pids are not this host's: no /proc
            from gpulens.exporter.jobmap import JobMapper

            enrichers.append(JobMapper(job_map_dir=options.job_map_dir, inspect_processes=False).enrich)
    else:
        if options.source == "dcgm":
            from gpulens.exporter.dcgmsource import DcgmSource

            source = DcgmSource(options.dcgm_url, node=options.node if options.node_given else None)
        else:
            source = _nvml_source(options)
        from gpulens.exporter.jobmap import JobMapper

        enrichers = [JobMapper(proc_root=options.proc_root, job_map_dir=options.job_map_dir).enrich]
        pods = _pod_mapper(options)
        if pods is not None:  # after the cgroups: it names the pods their processes belong to
            enrichers.append(pods[0])
            readers[pods[1].reader.name] = pods[1].state
            side_closers.append(pods[1].close)
        if options.fabric:  # after the job mapping: the job cgroups are found from the GPU processes
            from gpulens.exporter.fabric.node import FabricReader

            fabric = FabricReader(options.node, sysfs_root=options.sysfs_root, proc_root=options.proc_root)
            background = BackgroundEnricher(
                "fabric",
                fabric.enrich,
                ("nics", "host", "job_hosts"),
                interval_s=options.interval_s,
                deadline_s=SIDE_DEADLINE_S,
            )
            enrichers.append(background.enrich)
            readers["fabric"] = background.reader.state
            side_closers.append(background.close)
            enrichers.append(_hardware_reader(options))  # after the ports: peermem is read where RDMA ports exist
        if options.nccl_ras:  # last: it maps ranks to the jobs the job mapper found
            from gpulens.exporter.ncclras import NcclRasReader

            enrichers.append(
                NcclRasReader(options.nccl_ras_addr, interval_s=options.interval_s, proc_root=options.proc_root).enrich
            )
    if options.nccl_inspector_dir:  # after the job mapping: a rank's job and GPU come from its process
        inspector = _inspector_reader(options)
        enrichers.append(inspector.enrich)
        readers[inspector.reader.name] = inspector.reader.state
        side_closers.append(inspector.close)
    closers = [*side_closers, source.close]
    kernel = _kernel_log(options)
    if kernel is not None:  # first: the enrichers after it see each GPU's merged XID counts
        enrichers.insert(0, kernel[0])
        closers.append(kernel[1])
    if _wants_slurm(options.job_info):  # last: it names the jobs every step before found
        from gpulens.exporter.slurmjobs import SlurmJobInfo

        job_info = SlurmJobInfo()
        enrichers.append(job_info.enrich)
        closers.append(job_info.close)
    enrich = _chain(enrichers) if enrichers else None
    poller = Poller(
        source,
        interval_s=options.interval_s,
        enrich=enrich,
        dcgm_compat=options.dcgm_compat,
        process_pids=options.process_pids,
        user_names=options.user_names,
        readers=readers,
    )

    def close() -> None:
        for step in closers:
            step()

    return Routes(single=poller), poller, close


def _inspector_reader(options: ExporterOptions) -> BackgroundEnricher:
    from gpulens.exporter.inspectorread import InspectorReader

    reader = InspectorReader(options.nccl_inspector_dir or "")
    return BackgroundEnricher(
        "nccl_inspector", reader.enrich, ("inspector",), interval_s=options.interval_s, deadline_s=SIDE_DEADLINE_S
    )


def _hardware_reader(options: ExporterOptions) -> Enricher:
    from gpulens.exporter.fabric.hardware import Expectation, HardwareReader

    expect = Expectation(options.expect_gpus, options.expect_ib_ports, options.expect_ib_rate_gbps)
    return HardwareReader(root=options.sysfs_root, proc_root=options.proc_root, expect=expect).enrich


def _wants_slurm(job_info: str) -> bool:
    if job_info not in ("auto", "slurm", "none"):
        raise ConfigError(f"--job-info must be auto, slurm or none, not {job_info!r}", key="--job-info")
    if job_info != "auto":
        return job_info == "slurm"
    # auto: a Slurm client that can find its cluster (a config file, SLURM_CONF, or configless slurmd's cache)
    configured = "SLURM_CONF" in os.environ or any(Path(p).exists() for p in _SLURM_CONFIGS)
    return configured and shutil.which("squeue") is not None


def _kernel_log(options: ExporterOptions) -> tuple[Enricher, Callable[[], None]] | None:
    """The XID ledger (each XID once, its action, escalation) and, where a kernel log is read, its follower."""
    from gpulens.exporter.kernlogfollow import KernelLogFollower, default_kernel_log
    from gpulens.exporter.xidledger import XidLedger

    path = options.kernel_log
    if path is None and options.source != "sim" and _local_gpus(options):
        path = default_kernel_log()
        if path is None:
            logger.info("no readable /dev/kmsg: XIDs come from the source alone (--kernel-log names a file)")
    if options.source == "sim" and not path:
        return None  # the simulator models the kernel log itself
    if path and not os.path.exists(path):
        raise ConfigError(f"--kernel-log {path}: no such file", key="--kernel-log")
    ledger = XidLedger(options.state_dir)
    if not path:
        return ledger.enrich, lambda: None
    follower = KernelLogFollower(path, ledger)
    follower.start()

    def enrich(snapshot: NodeSnapshot) -> NodeSnapshot:
        snapshot = ledger.enrich(snapshot)
        errors = follower.errors()
        if errors:
            merged = dict(snapshot.errors)
            for reason, count in errors.items():
                merged[reason] = merged.get(reason, 0) + count
            snapshot = snapshot.replace(errors=merged)
        return snapshot

    return enrich, follower.close


def _local_gpus(options: ExporterOptions) -> bool:
    """Whether the GPUs read are this machine's (NVML, or a dcgm-exporter at a loopback address): only then is this
    machine's kernel log theirs."""
    if options.source != "dcgm":
        return True
    host = urlsplit(options.dcgm_url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _pod_mapper(options: ExporterOptions) -> tuple[Enricher, BackgroundLister] | None:
    """The kubelet's pod-resources mapper, with the reader that asks the kubelet off the collection path, where its
    socket was named or the default one exists; None elsewhere.

    A missing k8s extra is a ConfigError (one line, with the hint) when the socket was named; at the default path it
    is logged once and the node runs without pod names."""
    path = options.kubelet_socket
    if not path or (not options.kubelet_socket_given and not os.path.exists(path)):
        return None
    try:
        require_k8s("--kubelet-socket")
    except MissingExtraError as exc:
        if options.kubelet_socket_given:
            raise ConfigError(str(exc), key="--kubelet-socket") from None
        logger.warning("%s is present, but pods cannot be named: %s", path, exc)
        return None
    from gpulens.exporter.podresources.background import BackgroundLister
    from gpulens.exporter.podresources.client import KubeletClient
    from gpulens.exporter.podresources.mapper import PodMapper

    lister = BackgroundLister(
        KubeletClient(path, timeout_s=SIDE_DEADLINE_S),
        interval_s=max(options.interval_s, 1.0),
        deadline_s=SIDE_DEADLINE_S,
    )
    return PodMapper(lister, clock=time.monotonic).enrich, lister


def _chain(enrichers: list[Enricher]) -> Enricher:
    def enrich(snapshot: NodeSnapshot) -> NodeSnapshot:
        for step in enrichers:
            snapshot = step(snapshot)
        return snapshot

    return enrich


FIRST_COLLECTION_WAIT_S = 5.0
SIDE_DEADLINE_S = 2.0  # how late a side reader (pods, fabric) may be before its part is marked stale
_SLURM_CONFIGS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/run/slurm/conf/slurm.conf")


LOOPBACK_HOSTS: Final = ("127.0.0.1", "::1", "localhost")
# The first-run hint of an exporter open to the network without TLS or auth (docs/security.md gives the same steps).
PLAIN_HTTP_HINT: Final = (
    "gpulens exporter: plain HTTP without auth; to turn on TLS and basic auth: deploy/make-secrets.sh --web DIR, then "
    "--web-config DIR/web/web.yml (GPULENS_EXPORTER_WEB_CONFIG), and give the collector's target username "
    '"collector", password_file DIR/web/collector-password and ca_file DIR/web/tls.crt (docs/security.md)'
)


def run_exporter(options: ExporterOptions, announce: Callable[[str], None], stop: threading.Event) -> int:
    """Serve until ``stop`` is set. Raises ConfigError / SourceError / OSError on a bad start."""
    host, port = _listen(options.listen)
    web = load_web_config(options.web_config) if options.web_config else WebConfig()
    routes, poller, close_source = build_routes(options)
    try:
        try:
            server = exporter_server(routes, host=host, port=port, web=web)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot listen on {options.listen}: {exc.strerror or exc}") from None
        server.start()  # first: /healthz answers 503 "starting" while the first collection runs
        if poller is not None:
            poller.start()
            # Announce with data where the source answers at once; a slow one only delays the announcement.
            waited = time.monotonic() + FIRST_COLLECTION_WAIT_S
            while not poller.wait_first(0.1) and not stop.is_set() and time.monotonic() < waited:
                pass
        where = f"{server.scheme}://{f'[{host}]' if ':' in host else host}:{server.port}"
        if poller is None:
            announce(f"gpulens exporter serving {len(routes.nodes)} simulated nodes at {where}/node/<name>/metrics")
        else:
            announce(f"gpulens exporter ({options.source}) serving {where}/metrics")
        if not options.web_config and host not in LOOPBACK_HOSTS:
            announce(PLAIN_HTTP_HINT)
        try:
            stop.wait()
        finally:
            server.close()
            if poller is not None:
                poller.stop()
    finally:
        close_source()
    return 0


def _listen(value: str) -> tuple[str, int]:
    try:
        return parse_listen(value)
    except ValueError as exc:
        raise ConfigError(str(exc), key="--listen") from None
