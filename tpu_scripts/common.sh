# shellcheck shell=bash
# Shared by the tpu_scripts/*.sh launchers (sourced, never run): flag parsing with one-line errors,
# dry-run printing, the gcloud calls they have in common, and the remote shell snippets (code sync,
# "is the trainer running") that setup.sh, launch.sh and babysit.sh must agree on.
#
# Remote commands are single-line POSIX shell run by the worker's login shell (bash on Cloud TPU VMs).
# Every user-supplied word inside them is quoted with printf %q, so an override such as
# --config.data.system_prompt="Let's think; step by step" reaches the trainer's argv unchanged.
# Remote snippets are written in single quotes on purpose: $HOME, $(...) and $! must expand on the
# worker, not here (SC2016). The variables set here are read by the scripts that source this (SC2034).
# shellcheck disable=SC2016,SC2034

# jax[tpu] pin: the jax version the project is developed and tested with
# (tests/test_tpu_scripts.py checks it against the installed jax).
JAXRL_JAX_VERSION=0.10.2
JAXRL_LIBTPU_FIND_LINKS=https://storage.googleapis.com/jax-releases/libtpu_releases.html
# Name of the tarball that carries the code to the workers (copy mode), relative to the remote $HOME.
JAXRL_REMOTE_TARBALL=jaxrl_llm_code.tgz

SCRIPT_NAME=${0##*/}
TPU_SCRIPTS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Flags every script takes.
NAME=""
ZONE=""
PROJECT=""
DRY_RUN=0
# Flags of the scripts that touch the workers (setup.sh, launch.sh, babysit.sh).
REPO=$(dirname "$TPU_SCRIPTS_DIR")
GIT_URL=""
GIT_REF=main
CODE_DIR=jaxrl_llm
VENV_DIR=jaxrl_llm_venv
LOG_DIR=jaxrl_llm_logs
INTERNAL_IP=0

die() {
  printf '%s: error: %s\n' "$SCRIPT_NAME" "$*" >&2
  exit 2
}

note() {
  printf '%s: %s\n' "$SCRIPT_NAME" "$*" >&2
}

# ---------------------------------------------------------------------------------------------------
# Flag parsing
# ---------------------------------------------------------------------------------------------------

# need_value FLAG [VALUE...]: the flag must be followed by a value that is not itself a flag (a
# forgotten value would otherwise swallow the next flag). --extra-flag takes gcloud flags as values.
need_value() {
  (($# >= 2)) || die "$1 needs a value"
  case $2 in
    --*) [[ $1 == --extra-flag ]] || die "$1 needs a value, got the flag $2" ;;
  esac
}

require() {  # require FLAG VALUE
  [[ -n $2 ]] || die "$1 is required (see --help)"
}

# Consumes one flag every script takes; sets CONSUMED to the number of words used (0: not ours).
parse_common_flag() {
  CONSUMED=0
  case $1 in
    --name) need_value "$@"; NAME=$2; CONSUMED=2 ;;
    --zone) need_value "$@"; ZONE=$2; CONSUMED=2 ;;
    --project) need_value "$@"; PROJECT=$2; CONSUMED=2 ;;
    --dry-run) DRY_RUN=1; CONSUMED=1 ;;
    -h|--help) usage; exit 0 ;;
    *) return 1 ;;
  esac
}

# Consumes one flag about the code and the remote layout (setup.sh, launch.sh, babysit.sh).
parse_worker_flag() {
  CONSUMED=0
  case $1 in
    --repo) need_value "$@"; REPO=$2; CONSUMED=2 ;;
    --git-url) need_value "$@"; GIT_URL=$2; CONSUMED=2 ;;
    --git-ref) need_value "$@"; GIT_REF=$2; CONSUMED=2 ;;
    --code-dir) need_value "$@"; CODE_DIR=$2; CONSUMED=2 ;;
    --venv) need_value "$@"; VENV_DIR=$2; CONSUMED=2 ;;
    --log-dir) need_value "$@"; LOG_DIR=$2; CONSUMED=2 ;;
    --internal-ip) INTERNAL_IP=1; CONSUMED=1 ;;
    *) return 1 ;;
  esac
}

# Help text for the flags parse_common_flag and parse_worker_flag take.
COMMON_FLAGS_HELP='  --name NAME             (required) TPU name, also the queued-resource id
  --zone ZONE             (required) zone, e.g. us-east5-a
  --project PROJECT       GCP project (default: gcloud config)
  --dry-run               print the gcloud commands, one per line, and run nothing
  -h, --help              this help'
WORKER_FLAGS_HELP='  --repo DIR              local checkout to copy to the workers (default: this repo);
                          the files git lists travel: tracked + untracked-not-ignored
  --git-url URL           instead of copying, clone URL on every worker and check out --git-ref
  --git-ref REF           branch, tag or commit for --git-url (default: main)
  --code-dir DIR          code directory on the workers (default: jaxrl_llm, under $HOME)
  --venv DIR              virtualenv on the workers (default: jaxrl_llm_venv, under $HOME)
  --log-dir DIR           logs and pid file on the workers (default: jaxrl_llm_logs, under $HOME)
  --internal-ip           reach the workers by internal IP (from a VM in the same VPC)'

check_common_flags() {
  require --name "$NAME"
  require --zone "$ZONE"
  # TPU node ids: lowercase letters, digits and hyphens, starting with a letter.
  [[ $NAME =~ ^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$ ]] \
    || die "--name must be lowercase letters, digits and hyphens starting with a letter, got '$NAME'"
  [[ $ZONE =~ ^[a-z]+-[a-z]+[0-9]+-[a-z]$ ]] || die "--zone must look like us-east5-a, got '$ZONE'"
}

check_worker_flags() {
  local flag value
  while [[ $CODE_DIR == ?*/ ]]; do CODE_DIR=${CODE_DIR%/}; done
  while [[ $VENV_DIR == ?*/ ]]; do VENV_DIR=${VENV_DIR%/}; done
  while [[ $LOG_DIR == ?*/ ]]; do LOG_DIR=${LOG_DIR%/}; done
  for flag in --code-dir --venv --log-dir; do
    case $flag in
      --code-dir) value=$CODE_DIR ;;
      --venv) value=$VENV_DIR ;;
      *) value=$LOG_DIR ;;
    esac
    require "$flag" "$value"
    [[ $value != *[[:cntrl:]]* ]] || die "$flag must not contain control characters"
    # The code dir is replaced on every copy and a half-made venv is removed: a path such as . or
    # .. (the whole home directory) must never reach an rm -rf.
    [[ $value != / && ! $value =~ (^|/)\.\.?(/|$) ]] \
      || die "$flag must name a directory of its own, without . or .. components, got '$value'"
  done
  if [[ -z $GIT_URL ]]; then
    [[ -d $REPO ]] || die "--repo must be a directory, got '$REPO'"
    git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1 \
      || die "--repo $REPO is not a git work tree (the files git lists are what gets copied); use --git-url"
  fi
}

check_uint() {  # check_uint FLAG VALUE
  [[ $2 =~ ^[0-9]+$ ]] || die "$1 must be a non-negative integer, got '$2'"
}

# ---------------------------------------------------------------------------------------------------
# Printing and running commands
# ---------------------------------------------------------------------------------------------------

# One word quoted for a POSIX shell: bare when that is safe, else in single quotes (readable dry-run
# lines). Words with control characters use bash's printf %q so that each command stays on one line.
shq() {
  local s=$1
  if [[ -n $s && $s != *[!A-Za-z0-9_./:=@%+,-]* ]]; then
    printf '%s' "$s"
  elif [[ $s == *[[:cntrl:]]* ]]; then
    printf '%q' "$s"
  else
    printf "'%s'" "${s//\'/\'\\\'\'}"
  fi
}

show_cmd() {
  local out="" w
  for w in "$@"; do
    # --flag=value prints as --flag='value': the same word, easier to read.
    if [[ $w =~ ^--[A-Za-z0-9-]+= ]]; then
      out+="${BASH_REMATCH[0]}$(shq "${w#"${BASH_REMATCH[0]}"}") "
    else
      out+="$(shq "$w") "
    fi
  done
  printf '%s\n' "${out% }"
}

# Dry run: print the command (one line, copy-pasteable). Otherwise log it to stderr and run it.
run() {
  if ((DRY_RUN)); then
    show_cmd "$@"
    return 0
  fi
  note "+ $(show_cmd "$@")"
  "$@"
}

# gcloud compute tpus ... with the project appended when one was given.
gcloud_tpus() {
  run gcloud compute tpus "$@" ${PROJECT:+"--project=$PROJECT"}
}

# Runs one remote command on every worker of the TPU, concurrently; gcloud exits non-zero when the
# command failed on any worker.
ssh_all() {  # ssh_all REMOTE_COMMAND
  local ip_flag=()
  if ((INTERNAL_IP)); then ip_flag=(--internal-ip); fi
  gcloud_tpus tpu-vm ssh "$NAME" --zone="$ZONE" --worker=all ${ip_flag[@]+"${ip_flag[@]}"} \
    --command="$1"
}

# ---------------------------------------------------------------------------------------------------
# Remote snippets
# ---------------------------------------------------------------------------------------------------

# A path on the worker. Relative paths are under the remote $HOME; "$HOME"/ is left unquoted so that
# the worker expands it (quoting a leading ~ would keep it literal).
rpath() {
  case $1 in
    /*) printf '%q' "$1" ;;
    *) printf '"$HOME"/%q' "$1" ;;
  esac
}

# Defines running(): true when the pid file names a live jaxrl_llm.train process. The cmdline check
# keeps a stale pid file (after a reboot the pid may belong to anything) from counting as a run.
remote_running_fn() {
  printf 'pidf=%s/train.pid; running() { [ -s "$pidf" ] && grep -qs jaxrl_llm.train "/proc/$(cat "$pidf")/cmdline"; }' \
    "$(rpath "$LOG_DIR")"
}

# Stops the trainer that the pid file names: SIGTERM, then SIGKILL after 60 s (a trainer stuck in a
# collective, waiting for a host that died, may not act on TERM). Needs remote_running_fn first.
remote_stop_cmd() {
  printf '%s' 'if running; then echo "$(hostname): stopping jaxrl_llm.train (pid $(cat "$pidf"))" >&2; kill "$(cat "$pidf")" 2>/dev/null || true; i=0; while running && [ $i -lt 60 ]; do sleep 1; i=$((i+1)); done; if running; then kill -9 "$(cat "$pidf")" 2>/dev/null || true; fi; fi'
}

# Fails when the trainer runs: replacing its code or starting a second one would be wrong.
remote_refuse_cmd() {  # remote_refuse_cmd HINT
  printf 'if running; then echo "$(hostname): jaxrl_llm.train is running (pid $(cat "$pidf")); %s" >&2; exit 1; fi' "$1"
}

# Local half of the code copy: pack the files git lists in --repo (tracked, and untracked but not
# ignored, so uncommitted edits travel and .venv, workdirs and caches do not) and scp the tarball to
# every worker. Nothing to do with --git-url: the workers fetch the code themselves.
upload_code() {
  [[ -z $GIT_URL ]] || return 0
  local tarball ip_flag=()
  if ((INTERNAL_IP)); then ip_flag=(--internal-ip); fi
  if ((DRY_RUN)); then
    tarball=$(mktemp -u -d "${TMPDIR:-/tmp}/jaxrl_llm.XXXXXX")/$JAXRL_REMOTE_TARBALL
    note "dry run: would pack the files git lists in $REPO into $tarball"
  else
    CODE_TMP=$(mktemp -d "${TMPDIR:-/tmp}/jaxrl_llm.XXXXXX")
    trap 'rm -rf "$CODE_TMP"' EXIT
    tarball=$CODE_TMP/$JAXRL_REMOTE_TARBALL
    pack_repo "$REPO" "$tarball"
  fi
  gcloud_tpus tpu-vm scp "$tarball" "$NAME:$JAXRL_REMOTE_TARBALL" --zone="$ZONE" --worker=all \
    ${ip_flag[@]+"${ip_flag[@]}"}
}

pack_repo() {  # pack_repo REPO TARBALL
  local repo=$1 tarball=$2 list f
  list=$tarball.files
  : >"$list"
  # git also lists tracked files deleted from the work tree; tar would fail on those.
  while IFS= read -r -d '' f; do
    if [[ -f $repo/$f || -L $repo/$f ]]; then
      printf '%s\0' "$f" >>"$list"
    fi
  done < <(git -C "$repo" ls-files -z --cached --others --exclude-standard)
  [[ -s $list ]] || die "--repo $repo has no files to copy"
  tar -czf "$tarball" -C "$repo" --null -T "$list"
}

# Remote half: put the code in --code-dir. Copy mode unpacks next to it and swaps it in, so files
# deleted locally do not linger; the venv lives outside the code dir and survives the swap (the
# editable install points at the path, not at the files). Git mode clones once, then fetches and
# checks out --git-ref (detached); a tag or a commit gives every worker the same code, a branch that
# moves while the workers fetch would not.
remote_code_cmd() {
  local dir
  dir=$(rpath "$CODE_DIR")
  if [[ -n $GIT_URL ]]; then
    printf 'if [ ! -d %s/.git ]; then rm -rf %s; git clone -q %s %s; fi; git -C %s fetch -q origin %s; git -C %s checkout -q --force FETCH_HEAD' \
      "$dir" "$dir" "$(printf '%q' "$GIT_URL")" "$dir" "$dir" "$(printf '%q' "$GIT_REF")" "$dir"
  else
    printf 'rm -rf %s.new; mkdir -p %s.new; tar -xzf "$HOME"/%s -C %s.new; rm -rf %s; mv %s.new %s; rm -f "$HOME"/%s' \
      "$dir" "$dir" "$JAXRL_REMOTE_TARBALL" "$dir" "$dir" "$dir" "$dir" "$JAXRL_REMOTE_TARBALL"
  fi
}

# Default Cloud TPU software version per generation (https://cloud.google.com/tpu/docs/runtimes).
default_runtime_version() {  # default_runtime_version ACCELERATOR_TYPE
  case $1 in
    v6e-*) printf 'v2-alpha-tpuv6e' ;;
    v5p-*) printf 'v2-alpha-tpuv5' ;;
    v5litepod-*|v5e-*) printf 'v2-alpha-tpuv5-lite' ;;
    v2-*|v3-*|v4-*) printf 'tpu-ubuntu2204-base' ;;
    *) return 1 ;;
  esac
}
