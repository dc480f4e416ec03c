#!/usr/bin/env bash
# Keep a jaxrl_llm run alive on spot / preemptible Cloud TPUs until it finishes. Every --poll-interval
# seconds: stop if the trainer wrote <workdir>/DONE; otherwise read the TPU state, and
#   - preempted, terminated, failed, suspended or missing: delete it, create it again, set it up and
#     launch the same command; the trainer resumes from the latest checkpoint in the same workdir;
#   - ready but the trainer is not running on every worker (crash, maintenance reboot): set up and
#     relaunch (setup.sh --stop and launch.sh --restart stop the survivors first);
#   - anything else (creating, queued, repairing...): wait.
# It drives create.sh, delete.sh, setup.sh and launch.sh, so it takes their flags.
set -euo pipefail
# shellcheck source=tpu_scripts/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"

usage() {
  cat <<EOF
Usage: $SCRIPT_NAME --name NAME --zone ZONE --accelerator-type TYPE --config FILE[:ARG]
                  --workdir gs://BUCKET/PATH [options] [--config.a.b=V ...] [-- TRAINER_ARGS...]

Recreate the TPU after preemption and relaunch the run until it writes <workdir>/DONE.

$COMMON_FLAGS_HELP
  --accelerator-type TYPE (required) e.g. v5p-64, as for create.sh
  --runtime-version VER   as for create.sh
  --spot                  recreate on spot capacity
  --queued                the TPU is a queued resource (create.sh --queued)
  --extra-flag FLAG       extra flag for the gcloud create command, repeatable
$WORKER_FLAGS_HELP
  --python PY             as for setup.sh
  --jax-version VER       as for setup.sh
  --config FILE[:ARG]     (required) trainer config
  --workdir gs://B/P      (required) run directory; on GCS: a recreated TPU has a blank disk
  --config.a.b=V, -- ...  trainer flags, as for launch.sh
  --env NAME=VALUE        as for launch.sh, repeatable
  --poll-interval SEC     seconds between checks (default: 300)
  --max-iterations N      stop after N checks, 0 = until DONE (default: 0; with --dry-run: 1)
  --max-restarts N        give up (exit 1) after launching the trainer N times (default: 20)
  --delete-when-done      delete the TPU once the run is done

With --dry-run it prints the commands of one check, assuming the worst case: the run is not done
and the TPU was preempted (so: delete, create, setup, launch).
Exit status: 0 run done (or --max-iterations reached), 1 gave up, 2 bad usage.

Example:
  $SCRIPT_NAME --name rl-pod --zone us-east5-a --accelerator-type v5p-64 --spot \\
      --config configs/grpo_gsm8k.py --workdir gs://bucket/run1 --config.rollout.group_size=8
EOF
}

ACCELERATOR_TYPE=""
RUNTIME_VERSION=""
SPOT=0
QUEUED=0
EXTRA_FLAGS=()
PYTHON=""
JAX_VERSION=""
CONFIG=""
WORKDIR=""
ENVS=()
TRAIN_ARGS=()
POLL_INTERVAL=300
MAX_ITERATIONS=""
MAX_RESTARTS=20
DELETE_WHEN_DONE=0

while (($#)); do
  case $1 in
    --config.*) TRAIN_ARGS+=("$1"); shift; continue ;;
    --) shift; TRAIN_ARGS+=("$@"); break ;;
    # --flag=value is --flag value; only the word being parsed is split, never a flag's value.
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
  esac
  if parse_common_flag "$@"; then shift "$CONSUMED"; continue; fi
  if parse_worker_flag "$@"; then shift "$CONSUMED"; continue; fi
  case $1 in
    --accelerator-type) need_value "$@"; ACCELERATOR_TYPE=$2; shift 2 ;;
    --runtime-version) need_value "$@"; RUNTIME_VERSION=$2; shift 2 ;;
    --spot) SPOT=1; shift ;;
    --queued) QUEUED=1; shift ;;
    --extra-flag) need_value "$@"; EXTRA_FLAGS+=("$2"); shift 2 ;;
    --python) need_value "$@"; PYTHON=$2; shift 2 ;;
    --jax-version) need_value "$@"; JAX_VERSION=$2; shift 2 ;;
    --config) need_value "$@"; CONFIG=$2; shift 2 ;;
    --workdir) need_value "$@"; WORKDIR=$2; shift 2 ;;
    --env) need_value "$@"; ENVS+=("$2"); shift 2 ;;
    --poll-interval) need_value "$@"; POLL_INTERVAL=$2; shift 2 ;;
    --max-iterations) need_value "$@"; MAX_ITERATIONS=$2; shift 2 ;;
    --max-restarts) need_value "$@"; MAX_RESTARTS=$2; shift 2 ;;
    --delete-when-done) DELETE_WHEN_DONE=1; shift ;;
    *) die "unknown argument '$1' (see --help; trainer flags go after --)" ;;
  esac
done

check_common_flags
require --accelerator-type "$ACCELERATOR_TYPE"
require --config "$CONFIG"
require --workdir "$WORKDIR"
[[ $WORKDIR == gs://?* ]] \
  || die "--workdir must be gs://BUCKET/PATH: a recreated TPU starts with a blank disk, so only GCS keeps the checkpoints to resume from"
check_uint --poll-interval "$POLL_INTERVAL"
check_uint --max-restarts "$MAX_RESTARTS"
if [[ -z $MAX_ITERATIONS ]]; then
  MAX_ITERATIONS=$DRY_RUN
fi
check_uint --max-iterations "$MAX_ITERATIONS"
if ((DRY_RUN && MAX_ITERATIONS == 0)); then
  die "--max-iterations 0 (until DONE) cannot end in a dry run, where DONE never appears"
fi
while [[ $WORKDIR == */ ]]; do WORKDIR=${WORKDIR%/}; done
DONE_URL=$WORKDIR/DONE

# ---------------------------------------------------------------------------------------------------
# Arguments for the scripts babysit drives
# ---------------------------------------------------------------------------------------------------
base_args=(--name "$NAME" --zone "$ZONE")
if [[ -n $PROJECT ]]; then base_args+=(--project "$PROJECT"); fi
if ((DRY_RUN)); then base_args+=(--dry-run); fi
worker_args=(--code-dir "$CODE_DIR" --venv "$VENV_DIR" --log-dir "$LOG_DIR")
if [[ -n $GIT_URL ]]; then
  worker_args+=(--git-url "$GIT_URL" --git-ref "$GIT_REF")
else
  worker_args+=(--repo "$REPO")
fi
if ((INTERNAL_IP)); then worker_args+=(--internal-ip); fi

create_args=("${base_args[@]}" --accelerator-type "$ACCELERATOR_TYPE")
if [[ -n $RUNTIME_VERSION ]]; then create_args+=(--runtime-version "$RUNTIME_VERSION"); fi
if ((SPOT)); then create_args+=(--spot); fi
delete_args=("${base_args[@]}")
if ((QUEUED)); then
  create_args+=(--queued)
  delete_args+=(--queued)
fi
for flag in ${EXTRA_FLAGS[@]+"${EXTRA_FLAGS[@]}"}; do create_args+=(--extra-flag "$flag"); done

# --stop and --restart: after a crash some workers may still hold the TPU (stuck in a collective).
setup_args=("${base_args[@]}" "${worker_args[@]}" --stop)
if [[ -n $PYTHON ]]; then setup_args+=(--python "$PYTHON"); fi
if [[ -n $JAX_VERSION ]]; then setup_args+=(--jax-version "$JAX_VERSION"); fi

launch_args=("${base_args[@]}" "${worker_args[@]}" --config "$CONFIG" --workdir "$WORKDIR" --restart)
for kv in ${ENVS[@]+"${ENVS[@]}"}; do launch_args+=(--env "$kv"); done
launch_args+=(-- ${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"})

sub() {  # sub SCRIPT ARGS...: run a sibling script (bash, so the file mode does not matter)
  local script=$1
  shift
  bash "$TPU_SCRIPTS_DIR/$script" "$@"
}

# Check every forwarded flag now, with the sibling scripts' own rules: a typo must fail at start-up,
# not hours later at the first preemption.
for script in create.sh delete.sh setup.sh launch.sh; do
  case $script in
    create.sh) check_args=("${create_args[@]}") ;;
    delete.sh) check_args=("${delete_args[@]}") ;;
    setup.sh) check_args=("${setup_args[@]}") ;;
    *) check_args=("${launch_args[@]}") ;;
  esac
  if ! check_err=$(sub "$script" --dry-run "${check_args[@]}" 2>&1 >/dev/null); then
    printf '%s\n' "$check_err" | grep -m 1 'error:' >&2 || printf '%s\n' "$check_err" >&2
    exit 2
  fi
done

if ((!DRY_RUN)); then
  ERR_FILE=$(mktemp "${TMPDIR:-/tmp}/jaxrl_llm_babysit.XXXXXX")
  trap 'rm -f "$ERR_FILE"' EXIT
fi

log() {
  note "[$(date -u '+%Y-%m-%dT%H:%M:%SZ')] $*"
}

# ---------------------------------------------------------------------------------------------------
# Probes. In a dry run they print their command and report the worst case.
# ---------------------------------------------------------------------------------------------------
run_is_done() {
  local cmd=(gcloud storage ls "$DONE_URL")
  if ((DRY_RUN)); then
    show_cmd "${cmd[@]}"
    return 1
  fi
  "${cmd[@]}" >/dev/null 2>&1
}

# Sets STATE to the TPU (or queued resource) state, MISSING when it does not exist, ERROR when gcloud
# failed otherwise (a network blip must not get a healthy TPU deleted).
query_state() {
  local cmd out
  if ((QUEUED)); then
    cmd=(gcloud compute tpus queued-resources describe "$NAME" --zone="$ZONE" '--format=value(state.state)')
  else
    cmd=(gcloud compute tpus tpu-vm describe "$NAME" --zone="$ZONE" '--format=value(state)')
  fi
  if [[ -n $PROJECT ]]; then cmd+=("--project=$PROJECT"); fi
  if ((DRY_RUN)); then
    show_cmd "${cmd[@]}"
    if ((QUEUED)); then STATE=SUSPENDED; else STATE=PREEMPTED; fi
    note "dry run: assuming the run is not done and the TPU is $STATE"
    return 0
  fi
  if out=$("${cmd[@]}" 2>"$ERR_FILE"); then
    out=${out//[[:space:]]/}
    STATE=${out:-UNKNOWN}
  elif grep -qiE 'NOT_FOUND|not found' "$ERR_FILE"; then
    STATE=MISSING
  else
    STATE=ERROR
    log "warning: could not read the TPU state: $(tail -n 1 "$ERR_FILE")"
  fi
}

# Returns 0 when jaxrl_llm.train runs on every worker, 3 when it is missing on at least one, another
# status when the workers could not be asked.
trainer_running() {
  ssh_all "$(remote_running_fn); running || exit 3"
}

# ---------------------------------------------------------------------------------------------------
# Actions
# ---------------------------------------------------------------------------------------------------
RESTARTS=0

finish() {
  log "the run wrote $DONE_URL: done"
  if ((DELETE_WHEN_DONE)); then
    sub delete.sh "${delete_args[@]}" || { log "error: could not delete the TPU; delete it with delete.sh"; exit 1; }
  fi
  exit 0
}

relaunch() {  # relaunch REASON
  RESTARTS=$((RESTARTS + 1))
  if ((RESTARTS > MAX_RESTARTS)); then
    log "error: giving up: the trainer was launched $MAX_RESTARTS times (--max-restarts) and $DONE_URL is still missing; see the log on the workers"
    exit 1
  fi
  log "launch $RESTARTS of at most $MAX_RESTARTS: $1"
  if ! sub setup.sh "${setup_args[@]}"; then
    log "warning: setup failed; retrying at the next check"
    return 0
  fi
  if ! sub launch.sh "${launch_args[@]}"; then
    log "warning: launch failed; retrying at the next check"
  fi
}

recreate() {
  log "TPU $NAME is $STATE: recreating it"
  if [[ $STATE != MISSING ]] && ! sub delete.sh "${delete_args[@]}"; then
    log "warning: delete failed; retrying at the next check"
    return 0
  fi
  if ! sub create.sh "${create_args[@]}"; then
    log "warning: create failed (no capacity?); retrying at the next check"
    return 0
  fi
  if ((QUEUED)); then
    if ((!DRY_RUN)); then
      log "queued resource accepted; setup and launch follow once it is ACTIVE"
      return 0
    fi
    note "dry run: setup and launch follow once the queued resource is ACTIVE"
  fi
  relaunch "recreated after $STATE"
}

check_once() {
  if run_is_done; then finish; fi
  query_state
  case $STATE in
    READY|ACTIVE)
      local rc=0
      trainer_running || rc=$?
      if ((rc == 0)); then
        log "TPU $STATE, trainer running"
      elif ((rc == 3)); then
        # It may have just finished: DONE is written before the trainer exits.
        if run_is_done; then finish; fi
        relaunch "TPU $STATE but the trainer is not running on every worker"
      else
        log "warning: could not reach the workers (status $rc); retrying at the next check"
      fi
      ;;
    MISSING|PREEMPTED|TERMINATED|FAILED|SUSPENDED) recreate ;;
    ERROR) ;;
    *) log "TPU $NAME is $STATE: waiting" ;;
  esac
}

log "babysitting $NAME ($ACCELERATOR_TYPE in $ZONE) until $DONE_URL exists; checking every $POLL_INTERVAL s"
iteration=0
while :; do
  iteration=$((iteration + 1))
  check_once
  if ((MAX_ITERATIONS > 0 && iteration >= MAX_ITERATIONS)); then
    log "stopping after $iteration check(s) (--max-iterations); the run has not reported DONE"
    exit 0
  fi
  if ((DRY_RUN)); then
    note "dry run: would sleep $POLL_INTERVAL s and check again"
  else
    sleep "$POLL_INTERVAL"
  fi
done
