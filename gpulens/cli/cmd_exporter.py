"""``gpulens exporter``: the per-node agent's flags, and starting it."""

from __future__ import annotations

import argparse
import socket
import sys
from typing import Any

from gpulens.cli.base import Formatter, existing_directory, http_url, positive_duration, positive_float, positive_int
from gpulens.cli.envtwins import apply_env_twins
from gpulens.cli.lifecycle import stop_on_signals

# The kubelet's default (client.DEFAULT_SOCKET; not imported here, so that --help needs no gRPC).
DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_STATE_DIR = "/var/lib/gpulens/exporter"

EXPORTER_EXAMPLES = """\
examples:
  # on a GPU node (reads NVML), Prometheus scrapes :9410/metrics
  gpulens exporter
  # map GPU processes to Slurm jobs through prolog files, and add dcgm-exporter-named series for old dashboards
  gpulens exporter --job-map-dir /run/gpustat --dcgm-compat
  # GPU process memory per process (pid and command labels) rather than per job and GPU
  gpulens exporter --process-pids
  gpulens exporter --user-names          # also serve user and job names (reports per user need them)
  # simulated GPUs that carry the real Slurm jobs of this node (names and users from squeue)
  gpulens exporter --source sim --scenario examples/scenarios/healthy.toml --job-map-dir /run/gpustat
  # re-export a local dcgm-exporter with gpulens names (and its profiling fields)
  gpulens exporter --source dcgm --dcgm-url http://127.0.0.1:9400/metrics
  # one node of a simulated cluster, 10x faster than real time
  gpulens exporter --source sim --scenario examples/scenarios/stall.toml --node node-01 --speed 10
  # every node of a simulated cluster from one process: /node/<name>/metrics
  gpulens exporter --source sim --scenario examples/scenarios/healthy.toml --all-nodes --listen 127.0.0.1:9410
  # on a Kubernetes node: jobs are namespace/pod, from the kubelet's pod-resources API (pip install 'gpulens[k8s]')
  gpulens exporter --kubelet-socket /var/lib/kubelet/pod-resources/kubelet.sock
  # in a container with the host's root mounted read-only at /host (RDMA ports, PCIe, cgroups, /proc)
  gpulens exporter --sysfs-root /host --proc-root /host/proc
  # TLS and basic auth (Prometheus exporter-toolkit format)
  gpulens exporter --web-config /etc/gpulens/web.yml
  # XIDs from a file of kernel-log lines (journalctl -kf > /run/kern.log, a capture, a test feed)
  gpulens exporter --kernel-log /run/kern.log
  # an HGX node: 8 GPUs and 8 NDR ports, each at 400 Gb/s (GpuMissing, IbPortMissing, IbPortSlow)
  gpulens exporter --expect-gpus 8 --expect-ib-ports 8 --expect-ib-rate-gbps 400
  # jobs started with NCCL_RAS_ADDR=127.0.0.1:29029
  gpulens exporter --nccl-ras-addr 127.0.0.1:29029
  # jobs started with NCCL's Inspector (NCCL_INSPECTOR_DUMP_DIR=/var/lib/nccl-inspector/$SLURM_JOB_ID)
  gpulens exporter --nccl-inspector-dir /var/lib/nccl-inspector
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "exporter",
        help="run the per-node agent: /metrics, /api/v1/snapshot, /healthz",
        description="The per-node agent. Reads NVML, a dcgm-exporter or a simulated cluster in the background and "
        "serves Prometheus /metrics, a JSON snapshot at /api/v1/snapshot and /healthz.",
        epilog=EXPORTER_EXAMPLES,
        formatter_class=Formatter,
    )
    p.add_argument("--source", choices=["auto", "nvml", "dcgm", "sim"], default="auto", help="where readings come from")
    p.add_argument("--listen", default="0.0.0.0:9410", help="address to serve on, host:port")
    p.add_argument("--interval", type=positive_duration, default=1.0, help="collection interval (1s, 500ms, ...)")
    p.add_argument("--node", default=None, help="node name in every series (default: the host name)")
    p.add_argument(
        "--dcgm-url",
        type=http_url("http://127.0.0.1:9400/metrics"),
        default="http://127.0.0.1:9400/metrics",
        help="dcgm-exporter /metrics URL",
    )
    p.add_argument("--dcgm-compat", action="store_true", help="also export dcgm-exporter-named families")
    p.add_argument(
        "--process-pids",
        action="store_true",
        help="export GPU process memory per process (pid and command labels: series that come and go with every "
        "process) rather than per job and GPU",
    )
    p.add_argument(
        "--user-names",
        action="store_true",
        help="serve user names and job names (in /metrics and the snapshot): off by default, so the exporter names "
        "jobs by id, account and partition only; the collector's reports per user need it. Always on with "
        "--source sim, whose users are made up",
    )
    p.add_argument(
        "--job-map-dir",
        default=None,
        help="Slurm prolog files named by GPU UUID or index: a GPU named there holds that job, whatever the source "
        "(the simulator included) says",
    )
    p.add_argument(
        "--job-info",
        choices=["auto", "slurm", "none"],
        default="auto",
        help="where job names, users, accounts and partitions come from: slurm (squeue --json, in the background), "
        "none, or auto (slurm where squeue is installed and slurm.conf or SLURM_CONF names a cluster)",
    )
    p.add_argument(
        "--kubelet-socket",
        default=None,
        help="the kubelet's pod-resources socket: names the pod and container holding each GPU (needs the k8s extra; "
        f"default {DEFAULT_KUBELET_SOCKET}, read where it exists; '' turns it off)",
    )
    p.add_argument(
        "--proc-root",
        default="/proc",
        help="the host's /proc: processes' cgroup, status and comm, CPU and memory (NCCL ranks: io and stat)",
    )
    p.add_argument(
        "--sysfs-root",
        default="/",
        help="where the host's sys/ hangs: RDMA ports (sys/class/infiniband), PCIe topology and job cgroups "
        "(sys/fs/cgroup) are read under it",
    )
    p.add_argument(
        "--no-fabric",
        action="store_true",
        help="do not read RDMA ports, host CPU and memory, job cgroups or the PCI bus (GPUs only)",
    )
    p.add_argument(
        "--expect-gpus",
        type=positive_int,
        default=None,
        help="the GPUs this node should have: fewer on the PCI bus (or opened by NVML) fires GpuMissing",
    )
    p.add_argument(
        "--expect-ib-ports",
        type=positive_int,
        default=None,
        help="the InfiniBand ports that should be up (ACTIVE, LinkUp): fewer fires IbPortMissing",
    )
    p.add_argument(
        "--expect-ib-rate-gbps",
        type=positive_float,
        default=None,
        help="the rate each InfiniBand port should run at, in Gb/s as ibstat prints it (400 for NDR): a port below "
        "it fires IbPortSlow",
    )
    p.add_argument(
        "--nccl-ras",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="read NCCL's own view of the jobs on this node from NCCL RAS (NCCL 2.24 and later); --no-nccl-ras: not",
    )
    p.add_argument(
        "--nccl-ras-addr",
        type=ras_address,
        default="127.0.0.1:28028",
        help="where NCCL RAS listens (NCCL_RAS_ADDR of the jobs); only connected to, never bound",
    )
    p.add_argument(
        "--nccl-inspector-dir",
        default="",
        help="read NCCL Inspector output (NCCL 2.28.3 and later: JSON logs and Prometheus files) from this "
        "directory and the folders directly under it; '' for none (docs/nccl-inspector.md)",
    )
    p.add_argument(
        "--kernel-log",
        default=None,
        help="where to read the driver's Xid and NVSwitch SXid lines: /dev/kmsg (the default where it is readable; "
        "from its end), a file of kernel-log lines (read whole, then followed), or '' for none",
    )
    p.add_argument(
        "--state-dir",
        default=DEFAULT_STATE_DIR,
        help="where the exporter keeps state across restarts and reboots (XID occurrences per GPU); '' for none",
    )
    p.add_argument("--web-config", default=None, help="TLS and basic-auth config (exporter-toolkit YAML)")
    p.add_argument("--scenario", default=None, help="scenario TOML for --source sim")
    p.add_argument("--speed", type=positive_float, default=1.0, help="virtual time speed-up for --source sim")
    p.add_argument("--all-nodes", action="store_true", help="--source sim: serve every node at /node/<name>/")
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info", help="logging verbosity"
    )
    apply_env_twins(p, "GPULENS_EXPORTER_")
    p.set_defaults(func=_run_exporter)


def ras_address(value: str) -> str:
    from gpulens.netaddr import parse_listen

    try:
        parse_listen(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected host:port, e.g. 127.0.0.1:28028 ({exc})") from None
    return value


def _run_exporter(args: argparse.Namespace) -> int:
    from gpulens.exporter.agent import ExporterOptions, run_exporter

    if args.job_map_dir is not None:  # every source, the simulator included
        existing_directory("--job-map-dir", args.job_map_dir, "the directory the Slurm prolog writes, /run/gpustat")
    if args.source != "sim":  # the job mapper reads them; a simulated cluster has its own processes
        if args.proc_root != "/proc":
            existing_directory("--proc-root", args.proc_root, "the host's /proc, mounted in the container")
        if args.sysfs_root != "/":
            existing_directory("--sysfs-root", args.sysfs_root, "the directory the host's sys/ hangs from, e.g. /host")
    options = ExporterOptions(
        source=args.source,
        listen=args.listen,
        interval_s=args.interval,
        node=args.node or socket.gethostname(),
        node_given=args.node is not None,
        dcgm_url=args.dcgm_url,
        dcgm_compat=args.dcgm_compat,
        process_pids=args.process_pids,
        user_names=args.user_names or args.source == "sim",  # the simulator's users are made up
        job_map_dir=args.job_map_dir,
        job_info=args.job_info,
        proc_root=args.proc_root,
        sysfs_root=args.sysfs_root,
        fabric=not args.no_fabric,
        web_config=args.web_config,
        scenario=args.scenario,
        speed=args.speed,
        all_nodes=args.all_nodes,
        kubelet_socket=DEFAULT_KUBELET_SOCKET if args.kubelet_socket is None else args.kubelet_socket,
        kubelet_socket_given=args.kubelet_socket is not None,
        nccl_ras=args.nccl_ras,
        nccl_ras_addr=args.nccl_ras_addr,
        nccl_inspector_dir=args.nccl_inspector_dir or None,
        kernel_log=args.kernel_log,
        state_dir=args.state_dir or None,
        expect_gpus=args.expect_gpus,
        expect_ib_ports=args.expect_ib_ports,
        expect_ib_rate_gbps=args.expect_ib_rate_gbps,
    )
    with stop_on_signals() as stop:
        return run_exporter(options, lambda line: print(line, file=sys.stderr, flush=True), stop)
