#!/bin/bash
# node-problem-detector custom plugin: one fleetscope node condition, read from its verdict file.
#
#   verdict.sh gpu|efa|training [MAX_AGE_SECONDS]
#
# The fleetscope pod's `verdicts` container (`fleetscope check --write DIR --every 30`) writes one file
# per condition into DIR: the exit code, the one-line message, then every finding. This script runs in
# node-problem-detector's own image (bash and coreutils, no Python, no fleetscope) and answers at once,
# in the plugin protocol: exit 0 (condition False), 1 (True) or 2 (Unknown), the message on stdout.
# A verdict older than MAX_AGE_SECONDS (its writer stuck or gone) is Unknown, never a stale True or False;
# so is one dated in the future (the clock set back since it was written: its age cannot be known), until
# the writer's next round replaces it.

set -u

condition="${1:-}"
max_age="${2:-120}"
dir="${FLEETSCOPE_VERDICTS:-/run/fleetscope/verdicts}"

case "$condition" in
    gpu|efa|training) ;;
    *) echo "usage: verdict.sh gpu|efa|training [MAX_AGE_SECONDS]"; exit 2 ;;
esac
file="$dir/$condition"

if ! verdict="$(head -n 2 -- "$file" 2>/dev/null)" || [ -z "$verdict" ]; then
    echo "no fleetscope verdict yet: is the verdicts container running?"
    exit 2
fi
{ IFS= read -r code; IFS= read -r message; } <<< "$verdict"
written="$(stat -c %Y -- "$file" 2>/dev/null)" || written=0
age=$(( $(date +%s) - written ))
if (( age > max_age )); then
    echo "stale fleetscope verdict (${age}s old): is the verdicts container running?"
    exit 2
fi
# A few seconds of slack for file systems whose timestamps run ahead of date(1) by a tick.
if (( age < -5 )); then
    echo "fleetscope verdict dated $(( -age ))s in the future (clock set back?)"
    exit 2
fi
# One line without control characters, whatever is in the file (check writes it so already).
printf '%s\n' "${message//[[:cntrl:]]/ }"
case "$code" in
    0|1) exit "$code" ;;
    *) exit 2 ;;
esac
