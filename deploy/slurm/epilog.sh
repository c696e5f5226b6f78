#!/usr/bin/env bash
# Slurm epilog: forget the job's GPUs, undoing prolog.sh.
#
# Removes the job's "<jobid> <uid>" lines from every file in /run/gpustat and deletes the files left empty. It goes by
# the files' contents, not by the GPU list, so it needs no nvidia-smi and also cleans up after a prolog that mapped
# the GPUs differently. Lines of other jobs sharing a GPU stay.
#
# Install on every GPU node, run by slurmd as root (slurm.conf):  Epilog=/etc/slurm/epilog.d/*
# Errors are logged and the script exits 0: a failing epilog would drain the node.
#
# Environment: SLURM_JOB_ID. GPUSTAT_DIR overrides /run/gpustat.
set -Eeuo pipefail

readonly dir=${GPUSTAT_DIR:-/run/gpustat}
readonly tag=gpustat-epilog

log() {
  printf '%s: %s\n' "$tag" "$*" >&2
  if command -v logger >/dev/null; then logger -t "$tag" -- "$*" || true; fi
}
trap 'log "unexpected failure at line $LINENO; job ${SLURM_JOB_ID:-?} may still be mapped"; exit 0' ERR

# Drop job $2's lines from file $1, atomically; remove the file once no line is left. Callers hold the lock.
drop_job_lines() {
  local file=$1 job=$2 tmp line found=0
  tmp=$(mktemp "$dir/.tmp.XXXXXX")
  while IFS= read -r line || [[ -n $line ]]; do
    if [[ ${line%% *} == "$job" ]]; then
      found=1
    elif [[ -n $line ]]; then
      printf '%s\n' "$line"
    fi
  done <"$file" >"$tmp"
  if [[ $found -eq 0 ]]; then
    rm -f "$tmp"
  elif [[ -s $tmp ]]; then
    chmod 0644 "$tmp"
    mv -f "$tmp" "$file"
  else
    rm -f "$tmp" "$file"
  fi
}

job=${SLURM_JOB_ID:-}
if [[ ! $job =~ ^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$ ]]; then
  log "SLURM_JOB_ID='$job' is missing or malformed; nothing removed"
  exit 0
fi
if [[ ! -d $dir ]]; then
  exit 0
fi

exec {lock}>"$dir/.lock"
flock "$lock"
for file in "$dir"/*; do
  if [[ -f $file ]]; then drop_job_lines "$file" "$job"; fi
done
