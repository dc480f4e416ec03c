#!/usr/bin/env bash
# Start `python -m jaxrl_llm.train` on every worker of a Cloud TPU VM, with identical arguments, in the
# background (nohup, log and pid file on each worker). JAX's multi-controller runtime needs exactly
# this: one process per host running the same program; jax.distributed.initialize() finds the other
# hosts of the slice by itself. Rerunning with the same --workdir resumes from its latest checkpoint.
# Parts of the remote script are single-quoted on purpose: they expand on the workers.
# shellcheck disable=SC2016
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<EOF
Usage: $SCRIPT_NAME --name NAME --zone ZONE --config FILE[:ARG] --workdir DIR [options]
                 [--config.a.b=V ...] [-- TRAINER_ARGS...]

Copy the code to every worker and start jaxrl_llm.train there in the background.

$COMMON_FLAGS_HELP
$WORKER_FLAGS_HELP
  --config FILE[:ARG]     (required) trainer config, relative to the code dir
  --workdir DIR           (required) run directory; use gs://BUCKET/PATH so that every host
                          sees it and checkpoints survive the TPU
  --config.a.b=V          config override, passed to the trainer as is (repeatable)
  -- ARGS...              everything after -- goes to the trainer verbatim
  --env NAME=VALUE        environment variable for the trainer, repeatable
                          (e.g. --env LIBTPU_INIT_ARGS=--xla_tpu_enable_async_collective_fusion=true)
  --restart               stop a trainer this script started earlier (pid file) before starting;
                          without it, a running trainer makes the launch fail

On each worker: log in ~/jaxrl_llm_logs/train.log, pid in ~/jaxrl_llm_logs/train.pid (see --log-dir).

Example:
  $SCRIPT_NAME --name rl-pod --zone us-east5-a --config configs/grpo_gsm8k.py \\
      --workdir gs://bucket/run1 --config.rollout.group_size=8
EOF
}

CONFIG=""
WORKDIR=""
RESTART=0
ENVS=()
TRAIN_ARGS=()

while (($#)); do
  case $1 in
    # Trainer overrides are kept whole (their values may hold '=' and spaces).
    --config.*) TRAIN_ARGS+=("$1"); shift; continue ;;
    --) shift; TRAIN_ARGS+=("$@"); break ;;
    # --flag=value is --flag value; only the word being parsed is split, never a flag's value.
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
  esac
  if parse_common_flag "$@"; then shift "$CONSUMED"; continue; fi
  if parse_worker_flag "$@"; then shift "$CONSUMED"; continue; fi
  case $1 in
    --config) need_value "$@"; CONFIG=$2; shift 2 ;;
    --workdir) need_value "$@"; WORKDIR=$2; shift 2 ;;
    --env) need_value "$@"; ENVS+=("$2"); shift 2 ;;
    --restart) RESTART=1; shift ;;
    *) die "unknown argument '$1' (see --help; trainer flags go after --)" ;;
  esac
done
check_common_flags
check_worker_flags
require --config "$CONFIG"
require --workdir "$WORKDIR"
for kv in ${ENVS[@]+"${ENVS[@]}"}; do
  [[ $kv =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env must be NAME=VALUE, got '$kv'"
done
config_file=${CONFIG%%:*}
if [[ -z $GIT_URL && $config_file != /* && ! -f $REPO/$config_file ]]; then
  die "--config $config_file is not a file in --repo $REPO"
fi
if [[ $WORKDIR != gs://* ]]; then
  note "warning: --workdir $WORKDIR is on each worker's own disk: on a multi-host slice the hosts do not share it, and it is lost with the TPU; prefer gs://BUCKET/PATH"
fi

log=$(rpath "$LOG_DIR")/train.log
remote="set -e; $(remote_running_fn); mkdir -p $(rpath "$LOG_DIR")"
if ((RESTART)); then
  remote+="; $(remote_stop_cmd)"
else
  remote+="; $(remote_refuse_cmd 'pass --restart to replace it')"
fi
remote+="; $(remote_code_cmd); cd $(rpath "$CODE_DIR")"
for kv in ${ENVS[@]+"${ENVS[@]}"}; do
  remote+="; export ${kv%%=*}=$(printf '%q' "${kv#*=}")"
done
train="$(rpath "$VENV_DIR")/bin/python -m jaxrl_llm.train"
for arg in "--config=$CONFIG" "--workdir=$WORKDIR" ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"}; do
  train+=" $(printf '%q' "$arg")"
done
remote+="; echo \"=== \$(date -u) launch on \$(hostname)\" >> $log"
remote+="; nohup $train >> $log 2>&1 < /dev/null & echo \$! > \"\$pidf\""
remote+="; echo \"\$(hostname): started jaxrl_llm.train (pid \$!), log $log\""

upload_code
ssh_all "$remote"
