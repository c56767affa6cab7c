#!/bin/bash
# Slurm Prolog: record which GPUs of this node the starting job owns, so the
# fleetscope daemon labels their series with slurm_job_id even before (or
# without) a process of the job showing up on the GPU.
#
# One file per GPU in $FLEETSCOPE_JOBS_DIR (default /run/fleetscope/jobs, the
# daemon's gpu.jobs-dir), named by the GPU's global index, holding
# "<job id> <uid>" (jobstats' convention):
#   /run/fleetscope/jobs/3   ->   "1234 1001"
# Indices come from SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES (which holds
# global indices in the prolog). Jobs without GPUs write nothing.
#
# A failing Prolog drains the node and requeues the job, so this script always
# exits 0 and only logs its own problems.

set -u
PATH="${PATH:+$PATH:}/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
export PATH

JOBS_DIR="${FLEETSCOPE_JOBS_DIR:-/run/fleetscope/jobs}"

log() {
    logger -t fleetscope-prolog -- "$*" 2>/dev/null || printf '%s\n' "fleetscope-prolog: $*" >&2
}

job="${SLURM_JOB_ID:-}"
if ! [[ "$job" =~ ^[0-9]+$ ]]; then
    log "no usable SLURM_JOB_ID ('$job'); nothing recorded"
    exit 0
fi
uid="${SLURM_JOB_UID:-}"
[[ "$uid" =~ ^[0-9]+$ ]] || uid=""

gpu_list="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}"
gpus=()
IFS=',' read -r -a entries <<< "$gpu_list"
for entry in "${entries[@]}"; do
    entry="${entry//[[:space:]]/}"
    # Indices only: a UUID cannot be told apart from a MIG instance here.
    if [[ "$entry" =~ ^[0-9]+$ ]]; then
        gpus+=("$((10#$entry))")
    fi
done
[ "${#gpus[@]}" -gt 0 ] || exit 0

if ! mkdir -p "$JOBS_DIR"; then
    log "cannot create $JOBS_DIR; job $job not recorded"
    exit 0
fi
for gpu in "${gpus[@]}"; do
    # Write then rename, so the daemon never reads half a record.
    tmp="$(mktemp "$JOBS_DIR/.$gpu.XXXXXX")" || { log "cannot write in $JOBS_DIR"; exit 0; }
    if printf '%s %s\n' "$job" "$uid" > "$tmp" && chmod 0644 "$tmp" && mv -f "$tmp" "$JOBS_DIR/$gpu"; then
        continue
    fi
    rm -f "$tmp"
    log "could not record job $job on GPU $gpu"
done
exit 0
