#!/bin/bash
# AWS ParallelCluster OnNodeConfigured action for GPU compute nodes: install fleetscope as a systemd
# service, set the node's expected GPU and EFA counts from its instance type, and wire the Slurm health
# check, either fleetscope's own HealthCheckProgram or a check function for a site's NHC.
#
# Cluster configuration (docs/deploy.md, "ParallelCluster"):
#
#   Scheduling:
#     SlurmSettings:
#       CustomSlurmSettings:
#         - HealthCheckProgram: /opt/fleetscope/slurm/healthcheck.sh   # or /usr/sbin/nhc with --nhc
#         - HealthCheckInterval: 300
#         - HealthCheckNodeState: ANY,CYCLE
#     SlurmQueues:
#       - Name: train
#         CustomActions:
#           OnNodeConfigured:
#             Script: s3://BUCKET/fleetscope/deploy/slurm/parallelcluster/on-node-configured.sh
#             Args: [--source, s3://BUCKET/fleetscope, --package, fleetscope==VERSION]
#
#   on-node-configured.sh --source DIR|s3://... [--package SPEC] [--nhc] [--gpus N] [--efa N] [--root DIR]
#
#   --source   the fleetscope repository (or its release tree): a directory, or an S3 prefix synced with
#              the node's instance role (s3:GetObject and s3:ListBucket on it)
#   --package  what pip installs (default: the source tree itself)
#   --nhc      install the NHC check function (/etc/nhc/scripts/fleetscope.nhc) and add it to nhc.conf,
#              for clusters whose HealthCheckProgram is NHC
#   --gpus, --efa  expected counts (default: from the instance type; 0, unchecked, for an unknown one)
#   --root     install below DIR (tests, image builds); nothing is started
#
# Runs as root on each compute node after ParallelCluster configured it; safe to run again.

set -euo pipefail

source_tree=""
package=""
nhc=false
gpus=""
efa=""
root=""

while [ $# -gt 0 ]; do
    case "$1" in
        --source) source_tree="$2"; shift 2 ;;
        --package) package="$2"; shift 2 ;;
        --nhc) nhc=true; shift ;;
        --gpus) gpus="$2"; shift 2 ;;
        --efa) efa="$2"; shift 2 ;;
        --root) root="${2%/}"; shift 2 ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "on-node-configured.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -n "$source_tree" ] || { echo "on-node-configured.sh: --source is required" >&2; exit 2; }

# The instance type from the instance metadata service (IMDSv2, as ParallelCluster configures it).
instance_type() {
    if [ -n "${FLEETSCOPE_INSTANCE_TYPE:-}" ]; then
        printf '%s\n' "$FLEETSCOPE_INSTANCE_TYPE"
        return
    fi
    local token
    token="$(curl -sf -m 5 -X PUT http://169.254.169.254/latest/api/token \
        -H 'X-aws-ec2-metadata-token-ttl-seconds: 60')" || return 0
    curl -sf -m 5 -H "X-aws-ec2-metadata-token: $token" http://169.254.169.254/latest/meta-data/instance-type || true
}

# GPUs and EFA devices per instance type (the counts a healthy node shows; docs/deploy.md).
expected_counts() {
    case "$1" in
        p4d.24xlarge|p4de.24xlarge) echo "8 4" ;;
        p5.48xlarge|p5e.48xlarge) echo "8 32" ;;
        p5en.48xlarge) echo "8 16" ;;
        *) echo "0 0" ;;
    esac
}

type="$(instance_type)"
read -r table_gpus table_efa <<< "$(expected_counts "$type")"
gpus="${gpus:-$table_gpus}"
efa="${efa:-$table_efa}"
[[ "$gpus" =~ ^[0-9]+$ && "$efa" =~ ^[0-9]+$ ]] || { echo "on-node-configured.sh: --gpus and --efa take counts" >&2; exit 2; }
echo "fleetscope: instance type ${type:-unknown}: expecting $gpus GPUs and $efa EFA devices (0: unchecked)"

tree="$source_tree"
if [[ "$source_tree" == s3://* ]]; then
    tree="$root/opt/fleetscope/src"
    mkdir -p "$tree"
    aws s3 sync --only-show-errors --delete "${source_tree%/}/" "$tree/"
fi
[ -f "$tree/deploy/systemd/install.sh" ] || { echo "on-node-configured.sh: no deploy/systemd/install.sh under $tree" >&2; exit 2; }

# Installed stopped: the service starts once the counts below are set.
install_args=(--package "${package:-$tree}" --no-start)
[ -n "$root" ] && install_args+=(--root "$root")
bash "$tree/deploy/systemd/install.sh" "${install_args[@]}"

config="$root/etc/fleetscope/config.yaml"
# expected-count under gpu: and under efa: (install.sh keeps an existing config; this edits both keys only).
sed -i -e "/^gpu:/,/^[^[:space:]#]/ s/^\(  expected-count:\).*/\1 $gpus/" \
       -e "/^efa:/,/^[^[:space:]#]/ s/^\(  expected-count:\).*/\1 $efa/" "$config"

if $nhc; then
    install -d -m 0755 "$root/etc/nhc/scripts"
    install -m 0644 "$tree/deploy/slurm/nhc/fleetscope.nhc" "$root/etc/nhc/scripts/fleetscope.nhc"
    nhc_conf="$root/etc/nhc/nhc.conf"
    touch "$nhc_conf"
    grep -q 'check_fleetscope' "$nhc_conf" || printf '%s\n' '* || check_fleetscope' >> "$nhc_conf"
fi

if [ -z "$root" ]; then
    systemd-tmpfiles --create /etc/tmpfiles.d/fleetscope.conf
    systemctl daemon-reload
    systemctl enable --now fleetscope.service
    systemctl restart fleetscope.service
fi
echo "fleetscope: installed${root:+ below $root}; health check: $($nhc && echo "NHC check_fleetscope" || echo /opt/fleetscope/slurm/healthcheck.sh)"
