#!/usr/bin/env bash
# Start a one-node Slurm on this machine, for the end-to-end tests and a demo: the scheduler is real, the GPUs are
# stand-in character devices /dev/nvidia0-7.
#
#   deploy/slurm/testing/start-slurm.sh DIR
#
# Writes slurm.conf, gres.conf and cgroup.conf into DIR, creates /dev/nvidia0-7 if absent, and starts munged,
# slurmctld and slurmd (as root), then waits until the node is idle. Idempotent: a Slurm already running from DIR is
# left alone. Clients find it with SLURM_CONF=DIR/slurm.conf.
#
# slurmd runs the real deploy/slurm/prolog.sh and epilog.sh at allocation (PrologFlags=Alloc), writing the job map
# into DIR/gpustat (GPUSTAT_DIR). A stand-in nvidia-smi in DIR/bin, used by the prolog only, names Slurm's GPU i
# with the UUID in DIR/uuids line i+1 when that file exists (the test of an index order that is not NVML's); without
# it the prolog maps by index.
#
# The node claims 16 CPUs whatever the machine has (config_overrides), so that several small jobs run at once.
# munged is this Slurm's own too: its socket, pid file, log and seed live in DIR/munge (AuthInfo=socket=...), so a
# machine that is itself a Slurm node keeps its own munged and daemons untouched. The tests pass private ports.
# Environment: SLURM_TEST_CTLD_PORT (6817) and SLURM_TEST_SLURMD_PORT (6818); SLURM_TEST_GPUS (8).
set -euo pipefail

dir=${1:?usage: start-slurm.sh DIR}
mkdir -p -- "$dir"
dir=$(cd -- "$dir" && pwd)
here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
host=$(hostname -s)
ctld_port=${SLURM_TEST_CTLD_PORT:-6817}
slurmd_port=${SLURM_TEST_SLURMD_PORT:-6818}
gpus=${SLURM_TEST_GPUS:-8}
export SLURM_CONF=$dir/slurm.conf
munge_dir=$dir/munge
munge_socket=$munge_dir/munge.socket.2

node_idle() {
  local state
  state=$(sinfo -h -n "$host" -o '%T' 2>/dev/null) || return 1
  [[ $state == idle* || $state == mixed* || $state == allocated* || $state == drain* ]]
}

mkdir -p "$dir/state" "$dir/spool" "$dir/gpustat" "$dir/bin"

# The prolog and epilog: the real scripts, pointed at DIR/gpustat, with the stand-in nvidia-smi first on PATH.
for script in prolog epilog; do
  cat >"$dir/$script" <<SCRIPT
#!/usr/bin/env bash
export GPUSTAT_DIR=$dir/gpustat PATH=$dir/bin:\$PATH
exec $here/$script.sh
SCRIPT
  chmod 0755 "$dir/$script"
done
cat >"$dir/bin/nvidia-smi" <<SCRIPT
#!/usr/bin/env bash
# Stand-in for "nvidia-smi --query-gpu=index,uuid --format=csv,noheader": Slurm's index i is DIR/uuids line i+1.
[[ -s $dir/uuids ]] || { echo "no GPUs (stand-in nvidia-smi)" >&2; exit 9; }
i=0
while IFS= read -r uuid; do echo "\$i, \$uuid"; i=\$((i + 1)); done <$dir/uuids
SCRIPT
chmod 0755 "$dir/bin/nvidia-smi"

if [[ -f $SLURM_CONF ]] && scontrol ping >/dev/null 2>&1 && node_idle; then
  exit 0  # already running from this directory (the prolog and epilog above are this checkout's)
fi

for ((i = 0; i < gpus; i++)); do
  [[ -e /dev/nvidia$i ]] || mknod -m 0666 "/dev/nvidia$i" c 195 "$i"
done
cat >"$dir/slurm.conf" <<CONF
ClusterName=gpulens-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$munge_socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
SchedulerType=sched/backfill
ReturnToService=2
MinJobAge=300
KillWait=2
Prolog=$dir/prolog
Epilog=$dir/epilog
PrologFlags=Alloc
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=16 Gres=gpu:$gpus State=UNKNOWN
PartitionName=gpu Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
echo "NodeName=$host Name=gpu File=/dev/nvidia[0-$((gpus - 1))]" >"$dir/gres.conf"
echo "CgroupPlugin=autodetect" >"$dir/cgroup.conf"

if ! munge -S "$munge_socket" -n 2>/dev/null | unmunge -S "$munge_socket" >/dev/null 2>&1; then
  mkdir -p "$munge_dir"
  chmod 0755 "$munge_dir"
  munged --force --socket="$munge_socket" --pid-file="$munge_dir/munged.pid" --log-file="$munge_dir/munged.log" \
    --seed-file="$munge_dir/munged.seed"
fi
# A daemon of an earlier run from this directory that no longer answers is replaced.
for pidfile in "$dir/slurmctld.pid" "$dir/slurmd.pid"; do
  if [[ -s $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then kill "$(cat "$pidfile")" || true; fi
done
slurmctld -c -f "$SLURM_CONF"
for _ in $(seq 100); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
slurmd -f "$SLURM_CONF"
for _ in $(seq 300); do
  if node_idle; then exit 0; fi
  sleep 0.1
done
echo "start-slurm.sh: the node did not come up; see $dir/slurmctld.log and $dir/slurmd.log" >&2
exit 1
