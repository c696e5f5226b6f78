#!/usr/bin/env bash
# Slurm prolog: record which job holds which GPU, for `gpulens exporter --job-map-dir /run/gpustat`.
#
# For each GPU of the job it adds the line "<jobid> <uid>" to /run/gpustat/<GPU-UUID> and to /run/gpustat/<index>
# (the jobstats convention). The exporter prefers the UUID file, which names the GPU whatever order NVML enumerates
# GPUs in; indices become UUIDs here through nvidia-smi (README.md: this assumes Slurm's index is nvidia-smi's).
# Jobs that share a GPU (Slurm shards, MPS) each get a line.
#
# Install on every GPU node, run by slurmd as root (slurm.conf):  Prolog=/etc/slurm/prolog.d/*
# and pair it with epilog.sh. A monitoring problem never fails the job: errors are logged and the script exits 0,
# since a failing prolog would drain the node.
#
# Environment: SLURM_JOB_ID, SLURM_JOB_UID and the GPUs from SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES, else
# GPU_DEVICE_ORDINAL (indices, or GPU UUIDs). GPUSTAT_DIR overrides /run/gpustat.
set -Eeuo pipefail

umask 0022  # the exporter, an unprivileged user, reads the files
readonly dir=${GPUSTAT_DIR:-/run/gpustat}
readonly tag=gpustat-prolog

log() {
  printf '%s: %s\n' "$tag" "$*" >&2
  if command -v logger >/dev/null; then logger -t "$tag" -- "$*" || true; fi
}
trap 'log "unexpected failure at line $LINENO; job ${SLURM_JOB_ID:-?} is not mapped"; exit 0' ERR

# Replace the lines of job $2 in file $1 (other jobs' lines stay) by "$2 $3", atomically: the exporter never reads a
# half-written file. Callers hold the directory lock.
set_job_line() {
  local file=$1 job=$2 uid=$3 tmp line
  tmp=$(mktemp "$dir/.tmp.XXXXXX")
  if [[ -f $file ]]; then
    while IFS= read -r line || [[ -n $line ]]; do
      [[ -z $line || ${line%% *} == "$job" ]] || printf '%s\n' "$line"
    done <"$file" >"$tmp"
  fi
  printf '%s %s\n' "$job" "$uid" >>"$tmp"
  chmod 0644 "$tmp"  # mktemp creates 0600
  mv -f "$tmp" "$file"
}

job=${SLURM_JOB_ID:-}
uid=${SLURM_JOB_UID:-}
gpus=${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-${GPU_DEVICE_ORDINAL:-}}}
if [[ -z $gpus || $gpus == NoDevFiles ]]; then
  exit 0  # a job without GPUs
fi
if [[ ! $job =~ ^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$ || ! $uid =~ ^[0-9]{1,10}$ ]]; then
  log "SLURM_JOB_ID='$job' or SLURM_JOB_UID='$uid' is missing or malformed; job not mapped"
  exit 0
fi

declare -A uuid_of=()
if smi=$(nvidia-smi --query-gpu=index,uuid --format=csv,noheader 2>&1); then
  while IFS=', ' read -r index uuid; do
    if [[ $index =~ ^[0-9]+$ && $uuid == GPU-* ]]; then uuid_of[$index]=$uuid; fi
  done <<<"$smi"
else
  log "nvidia-smi failed ($smi); job $job is mapped by GPU index only"
fi

# The job's files: each GPU's index and, where nvidia-smi named it, its UUID. GPUs are given as "0,1", ranges "0-3"
# or UUIDs "GPU-...".
files=()
add_index() {
  files+=("$1")
  if [[ -n ${uuid_of[$1]:-} ]]; then files+=("${uuid_of[$1]}"); fi
}
IFS=, read -r -a entries <<<"$gpus"
for entry in "${entries[@]}"; do
  if [[ $entry =~ ^([0-9]+)-([0-9]+)$ ]]; then
    for ((i = BASH_REMATCH[1]; i <= BASH_REMATCH[2]; i++)); do add_index "$i"; done
  elif [[ $entry =~ ^[0-9]+$ ]]; then
    add_index "$entry"
  elif [[ $entry =~ ^GPU-[0-9A-Fa-f-]+$ ]]; then
    files+=("$entry")
  else
    log "GPU '$entry' of job $job is neither an index nor a GPU UUID; skipped"
  fi
done
if [[ ${#files[@]} -eq 0 ]]; then
  exit 0
fi

mkdir -p -- "$dir"
exec {lock}>"$dir/.lock"
flock "$lock"
for name in "${files[@]}"; do
  set_job_line "$dir/$name" "$job" "$uid"
done
