#!/bin/bash
# Slurm TaskProlog: point every task's fleetscope client at this node's
# daemon. slurmstepd turns "export NAME=value" lines printed here into the
# task's environment. Jobs can still override it in their own script.
#
# slurm.conf:  TaskProlog=/opt/fleetscope/slurm/task-prolog.sh

port="${FLEETSCOPE_PORT:-9402}"
if [ -z "${FLEETSCOPE_PUSH_URL:-}" ]; then
    echo "export FLEETSCOPE_PUSH_URL=http://127.0.0.1:${port}"
fi
exit 0
