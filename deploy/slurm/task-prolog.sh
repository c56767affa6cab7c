#!/bin/bash
# Slurm TaskProlog: point every task's fleetscope client at this node's
# daemon. slurmstepd turns "export NAME=value" lines printed here into the
# task's environment. Jobs can still override it in their own script.
#
# slurm.conf:  TaskProlog=/opt/fleetscope/slurm/task-prolog.sh

# The daemon's push listener: push.listen-address in /etc/fleetscope/config.yaml, on loopback (a
# rank reports to the daemon of the node it runs on).
port="${FLEETSCOPE_PORT:-9403}"
if [ -z "${FLEETSCOPE_PUSH_URL:-}" ]; then
    echo "export FLEETSCOPE_PUSH_URL=http://127.0.0.1:${port}"
fi
# NCCL Inspector (docs/deploy.md, "NCCL Inspector"): with the plugin installed, every task logs its NCCL
# collectives into a per-job directory the daemon reads (nccl.dir). A job that sets
# NCCL_PROFILER_PLUGIN itself keeps its own.
plugin="${FLEETSCOPE_NCCL_INSPECTOR_PLUGIN:-/opt/fleetscope/nccl/libnccl-profiler-inspector.so}"
if [ -z "${NCCL_PROFILER_PLUGIN:-}" ] && [ -r "$plugin" ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    echo "export NCCL_PROFILER_PLUGIN=${plugin}"
    echo "export NCCL_INSPECTOR_ENABLE=1"
    echo "export NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS=1000000"
    echo "export NCCL_INSPECTOR_DUMP_DIR=/var/lib/fleetscope/nccl-inspector/${SLURM_JOB_ID}"
fi
exit 0
