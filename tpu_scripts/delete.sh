#!/usr/bin/env bash
# Delete a Cloud TPU VM created by create.sh (or its queued resource, node included, with --queued).
# The workdir (gs://...) is untouched: checkpoints outlive the TPU.
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<EOF
Usage: $SCRIPT_NAME --name NAME --zone ZONE [options]

Delete a Cloud TPU VM, without a confirmation prompt.

$COMMON_FLAGS_HELP
  --queued                delete the queued resource NAME and its node (create.sh --queued)
  --async                 return without waiting for the deletion to finish

Example:
  $SCRIPT_NAME --name rl-pod --zone us-east5-a --queued
EOF
}

QUEUED=0
ASYNC=0

while (($#)); do
  # --flag=value is --flag value; only the word being parsed is split, never a flag's value.
  case $1 in --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;; esac
  if parse_common_flag "$@"; then shift "$CONSUMED"; continue; fi
  case $1 in
    --queued) QUEUED=1; shift ;;
    --async) ASYNC=1; shift ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
check_common_flags

async_flag=()
if ((ASYNC)); then async_flag=(--async); fi

# --quiet: no prompt, so that babysit.sh can run this unattended.
if ((QUEUED)); then
  # --force also deletes the node the queued resource provisioned (otherwise gcloud refuses).
  gcloud_tpus queued-resources delete "$NAME" --zone="$ZONE" --force --quiet \
    ${async_flag[@]+"${async_flag[@]}"}
else
  gcloud_tpus tpu-vm delete "$NAME" --zone="$ZONE" --quiet ${async_flag[@]+"${async_flag[@]}"}
fi
