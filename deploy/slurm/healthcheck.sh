#!/bin/bash
# Slurm HealthCheckProgram: drain this node when `fleetscope check` finds it
# unhealthy, and resume it once healthy again -- but only if fleetscope
# drained it. Drains set by operators or other tools (reasons not starting
# with "fleetscope:") are never touched.
#
# slurm.conf:
#   HealthCheckProgram=/opt/fleetscope/slurm/healthcheck.sh
#   HealthCheckInterval=300
#   HealthCheckNodeState=ANY,CYCLE
#
# With check.prometheus-url in the config, the verdict includes what Prometheus says about this node
# (docs/deploy.md, "Node conditions and drains"): a repeat straggler is drained as
# "fleetscope: training: repeat straggler (3 jobs)" and resumed once the alert resolves. A finding on too
# many nodes at once (the circuit breaker) and an unreachable Prometheus are "could not tell".
#
# `fleetscope check` exits 0 healthy, 1 unhealthy, 2 could not tell; anything
# else (timeout, configuration error, missing binary) counts as "could not
# tell", which changes nothing: a broken checker must not drain the fleet.

set -u

# slurmd runs this as root with an empty environment.
PATH="${PATH:+$PATH:}/opt/slurm/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
export PATH

FLEETSCOPE="${FLEETSCOPE:-/opt/fleetscope/venv/bin/fleetscope}"
CONFIG="${FLEETSCOPE_CHECK_CONFIG:-/etc/fleetscope/config.yaml}"
# Slurm kills the program after HealthCheckTimeout (60 s by default).
TIMEOUT="${FLEETSCOPE_CHECK_TIMEOUT:-45}"
REASON_PREFIX="fleetscope:"
# Long reasons clutter sinfo; the full findings go to the system log.
REASON_MAX=200

node="${SLURMD_NODENAME:-$(hostname -s)}"

log() {
    logger -t fleetscope-healthcheck -- "$node: $*" 2>/dev/null || printf '%s\n' "fleetscope-healthcheck: $node: $*" >&2
}

config_args=()
if [ -r "$CONFIG" ]; then
    config_args=(--config "$CONFIG")
fi

# This script's own knobs are not fleetscope settings (which it would refuse as unknown FLEETSCOPE_CHECK_*).
output="$(timeout --kill-after=5 "$TIMEOUT" env -u FLEETSCOPE_CHECK_CONFIG -u FLEETSCOPE_CHECK_TIMEOUT \
    "$FLEETSCOPE" check "${config_args[@]}" 2>&1)"
status=$?

node_line="$(scontrol -o show node "$node" 2>/dev/null)"
if [ -z "$node_line" ]; then
    log "cannot read node state from slurmctld (check exit $status); leaving the node as it is"
    exit 0
fi
state=""
if [[ "$node_line" =~ (^|[[:space:]])State=([^[:space:]]+) ]]; then
    state="${BASH_REMATCH[2]}"
fi
reason=""
if [[ "$node_line" =~ (^|[[:space:]])Reason=(.*)$ ]]; then
    reason="${BASH_REMATCH[2]}"
fi
drained=false
[[ "$state" == *DRAIN* ]] && drained=true
ours=false
[[ "$reason" == "$REASON_PREFIX"* ]] && ours=true

case "$status" in
    0)
        if $drained && $ours; then
            log "healthy again; resuming (was: $reason)"
            scontrol update NodeName="$node" State=RESUME || log "resume failed"
        fi
        ;;
    1)
        # The failing findings, one line each: "UNHEALTHY gpu: gpu 3: fell off the bus".
        problems="$(printf '%s\n' "$output" | sed -n 's/^UNHEALTHY //p' | paste -sd ';' - | sed 's/;/; /g')"
        [ -n "$problems" ] || problems="fleetscope check reported the node unhealthy"
        log "unhealthy: $problems"
        if $drained && ! $ours; then
            log "already drained by someone else ($reason); leaving their reason in place"
        elif $drained; then
            : # drained by us on an earlier run; keep the original reason and its timestamp
        else
            new_reason="$REASON_PREFIX $problems"
            # No control character reaches scontrol or sinfo (check's lines carry none; this holds anyway).
            new_reason="${new_reason//[[:cntrl:]]/ }"
            new_reason="${new_reason:0:$REASON_MAX}"
            scontrol update NodeName="$node" State=DRAIN Reason="$new_reason" || log "drain failed"
        fi
        ;;
    *)
        log "health unknown (fleetscope check exit $status); leaving the node as it is: $(printf '%s' "$output" | tail -n 3 | paste -sd ' ' -)"
        ;;
esac
exit 0
