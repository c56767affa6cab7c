#!/bin/bash
# Slurm Epilog: forget the finished job's GPUs (see prolog.sh). Only records
# that still name this job are removed: a GPU already handed to the next job
# keeps its record. A failing Epilog drains the node, so this always exits 0.

set -u
PATH="${PATH:+$PATH:}/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
export PATH

JOBS_DIR="${FLEETSCOPE_JOBS_DIR:-/run/fleetscope/jobs}"
job="${SLURM_JOB_ID:-}"
[[ "$job" =~ ^[0-9]+$ ]] || exit 0
[ -d "$JOBS_DIR" ] || exit 0

for record in "$JOBS_DIR"/*; do
    [ -f "$record" ] || continue
    owner=""
    read -r owner _ < "$record" 2>/dev/null || [ -n "$owner" ] || continue
    if [ "$owner" = "$job" ]; then
        rm -f -- "$record" || logger -t fleetscope-epilog -- "could not remove $record" 2>/dev/null
    fi
done
exit 0
