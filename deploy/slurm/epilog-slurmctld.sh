#!/usr/bin/env bash
# Slurm EpilogSlurmctld: store the ended job's gpulens accounting summary in its AdminComment, as jobstats does.
#
# Runs on the controller as SlurmUser when a job ends (slurm.conf):  EpilogSlurmctld=/etc/slurm/epilog-slurmctld.sh
# It asks `gpulens job-summary JOB_ID --json --compact` (which reads the gpulens store named in gpulens.toml: the
# collector's database) and writes the one-line JSON with `scontrol update JobId=... AdminComment=...`, where
# `sacct -j JOB_ID -o AdminComment%1000` shows it later. A job gpulens never saw (no GPU) gets no comment.
# Errors are logged and the script exits 0: slurmctld only logs a failing EpilogSlurmctld, but it has nothing to add.
#
# Environment: SLURM_JOB_ID (slurmctld sets it). GPULENS_CONFIG (default /etc/gpulens/gpulens.toml), GPULENS (the
# gpulens command, default gpulens) and SCONTROL (default scontrol) override the defaults.
set -Euo pipefail

readonly tag=gpulens-epilog-slurmctld
readonly config=${GPULENS_CONFIG:-/etc/gpulens/gpulens.toml}
readonly gpulens=${GPULENS:-gpulens}
readonly scontrol=${SCONTROL:-scontrol}

log() {
  printf '%s: %s\n' "$tag" "$*" >&2
  if command -v logger >/dev/null; then logger -t "$tag" -- "$*" || true; fi
}
trap 'log "unexpected failure at line $LINENO; job ${SLURM_JOB_ID:-?} keeps no summary"; exit 0' ERR

job=${SLURM_JOB_ID:-}
if [[ ! $job =~ ^[0-9]+(_[0-9]+)?$ ]]; then
  log "SLURM_JOB_ID is missing or not a job id: '${job}'"
  exit 0
fi

args=(job-summary "$job" --json --compact)
if [[ -r $config ]]; then
  args+=(--config "$config")
fi
if ! summary=$("$gpulens" "${args[@]}" 2>&1); then
  log "job $job: no summary: ${summary//$'\n'/ }"
  exit 0
fi
if ! out=$("$scontrol" update "JobId=$job" "AdminComment=$summary" 2>&1); then
  log "job $job: scontrol update failed: ${out//$'\n'/ }"
fi
exit 0
