#!/usr/bin/env bash
# Create a Cloud TPU VM (slice) for jaxrl_llm: directly with `tpu-vm create`, or through the queue with
# `queued-resources create` (--queued), on spot capacity with --spot.
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<EOF
Usage: $SCRIPT_NAME --name NAME --zone ZONE --accelerator-type TYPE [options]

Create a Cloud TPU VM for jaxrl_llm.

$COMMON_FLAGS_HELP
  --accelerator-type TYPE (required) e.g. v5p-64, v5litepod-16, v6e-8, v4-32
  --runtime-version VER   TPU software version (default by generation: v6e v2-alpha-tpuv6e,
                          v5p v2-alpha-tpuv5, v5e v2-alpha-tpuv5-lite, v2-v4 tpu-ubuntu2204-base)
  --spot                  spot capacity: cheaper, may be preempted at any time (see babysit.sh)
  --queued                request it as a queued resource (waits in the queue for capacity;
                          the queued-resource id and the node id are both --name)
  --extra-flag FLAG       extra flag for the gcloud create command, repeatable
                          (e.g. --extra-flag=--reserved --extra-flag=--network=my-net)

Example:
  $SCRIPT_NAME --name rl-pod --zone us-east5-a --accelerator-type v5p-64 --spot --queued
EOF
}

ACCELERATOR_TYPE=""
RUNTIME_VERSION=""
SPOT=0
QUEUED=0
EXTRA_FLAGS=()

while (($#)); do
  # --flag=value is --flag value; only the word being parsed is split, never a flag's value.
  case $1 in --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;; esac
  if parse_common_flag "$@"; then shift "$CONSUMED"; continue; fi
  case $1 in
    --accelerator-type) need_value "$@"; ACCELERATOR_TYPE=$2; shift 2 ;;
    --runtime-version) need_value "$@"; RUNTIME_VERSION=$2; shift 2 ;;
    --spot) SPOT=1; shift ;;
    --queued) QUEUED=1; shift ;;
    --extra-flag) need_value "$@"; EXTRA_FLAGS+=("$2"); shift 2 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

check_common_flags
require --accelerator-type "$ACCELERATOR_TYPE"
[[ $ACCELERATOR_TYPE =~ ^[a-z0-9]+-[0-9]+$ ]] \
  || die "--accelerator-type must look like v5p-64, got '$ACCELERATOR_TYPE'"
if [[ -z $RUNTIME_VERSION ]]; then
  RUNTIME_VERSION=$(default_runtime_version "$ACCELERATOR_TYPE") \
    || die "--runtime-version is required for $ACCELERATOR_TYPE (no default for this generation)"
fi
for flag in ${EXTRA_FLAGS[@]+"${EXTRA_FLAGS[@]}"}; do
  [[ $flag == --* ]] || die "--extra-flag takes a gcloud flag starting with --, got '$flag'"
done

spot_flag=()
if ((SPOT)); then spot_flag=(--spot); fi

if ((QUEUED)); then
  # Returns once the request is accepted; the node comes later (state ACTIVE), which babysit.sh
  # waits for. Check with: gcloud compute tpus queued-resources describe NAME --zone ZONE
  gcloud_tpus queued-resources create "$NAME" --zone="$ZONE" --node-id="$NAME" \
    --accelerator-type="$ACCELERATOR_TYPE" --runtime-version="$RUNTIME_VERSION" \
    ${spot_flag[@]+"${spot_flag[@]}"} ${EXTRA_FLAGS[@]+"${EXTRA_FLAGS[@]}"}
else
  # `tpu-vm create` names the software version --version (queued resources: --runtime-version).
  gcloud_tpus tpu-vm create "$NAME" --zone="$ZONE" --accelerator-type="$ACCELERATOR_TYPE" \
    --version="$RUNTIME_VERSION" ${spot_flag[@]+"${spot_flag[@]}"} \
    ${EXTRA_FLAGS[@]+"${EXTRA_FLAGS[@]}"}
fi
