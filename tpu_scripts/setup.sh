#!/usr/bin/env bash
# Install jaxrl_llm on every worker of a Cloud TPU VM: copy (or git-fetch) the code, make the venv if it
# is absent, install the pinned jax[tpu] and the package in editable mode. Idempotent: rerunning it
# only refreshes the code and lets pip confirm what is installed.
# Parts of the remote script are single-quoted on purpose: they expand on the workers.
# shellcheck disable=SC2016
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<EOF
Usage: $SCRIPT_NAME --name NAME --zone ZONE [options]

Install jaxrl_llm on every worker of a Cloud TPU VM (idempotent).

$COMMON_FLAGS_HELP
$WORKER_FLAGS_HELP
  --python PY             interpreter for the venv (default: python3.11; jaxrl_llm needs >= 3.11;
                          when it is missing, apt installs PY and PY-venv)
  --jax-version VER       jax[tpu] version to pin (default: $JAXRL_JAX_VERSION, the tested one)
  --stop                  stop a trainer that launch.sh started (pid file) instead of failing

Example:
  $SCRIPT_NAME --name rl-pod --zone us-east5-a
EOF
}

PYTHON=python3.11
JAX_VERSION=$JAXRL_JAX_VERSION
STOP=0

while (($#)); do
  # --flag=value is --flag value; only the word being parsed is split, never a flag's value.
  case $1 in --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;; esac
  if parse_common_flag "$@"; then shift "$CONSUMED"; continue; fi
  if parse_worker_flag "$@"; then shift "$CONSUMED"; continue; fi
  case $1 in
    --python) need_value "$@"; PYTHON=$2; shift 2 ;;
    --jax-version) need_value "$@"; JAX_VERSION=$2; shift 2 ;;
    --stop) STOP=1; shift ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
check_common_flags
check_worker_flags
[[ $JAX_VERSION =~ ^[0-9]+(\.[0-9]+)*$ ]] || die "--jax-version must look like $JAXRL_JAX_VERSION, got '$JAX_VERSION'"
[[ $PYTHON =~ ^[A-Za-z0-9_./+-]+$ ]] || die "--python must be an interpreter name or path, got '$PYTHON'"

venv=$(rpath "$VENV_DIR")
py=$(printf '%q' "$PYTHON")
remote="set -e; $(remote_running_fn)"
# Replacing the code under a live trainer would change what its later imports see.
if ((STOP)); then
  remote+="; $(remote_stop_cmd)"
else
  remote+="; $(remote_refuse_cmd 'pass --stop to stop it first')"
fi
remote+="; $(remote_code_cmd)"
# A venv that failed half-way (Debian splits ensurepip into PY-venv) is removed before the retry.
remote+="; if [ ! -x $venv/bin/python ]; then $py -m venv $venv || { rm -rf $venv; sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $py $py-venv && $py -m venv $venv; }; fi"
remote+="; $venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo \"\$(hostname): the venv has Python < 3.11 (jaxrl_llm needs >= 3.11): delete it and pass --python\" >&2; exit 1; }"
remote+="; $venv/bin/python -m pip install -q --upgrade pip"
remote+="; $venv/bin/python -m pip install -q $(printf '%q' "jax[tpu]==$JAX_VERSION") -f $JAXRL_LIBTPU_FIND_LINKS"
# The gcs extra: gs:// workdirs (etils.epath, TensorBoard) need gcsfs and google-cloud-storage.
remote+="; $venv/bin/python -m pip install -q -e $(rpath "$CODE_DIR")'[gcs]'"
remote+="; $venv/bin/python -c 'import jax, jaxrl_llm; print(\"jaxrl_llm ready, jax\", jax.__version__)'"

upload_code
ssh_all "$remote"
