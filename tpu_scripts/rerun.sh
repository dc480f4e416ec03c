#!/usr/bin/env bash
# Rerun a training command on the same machine while it stops "preempted, resumable": the trainer exits
# with status 75 after SIGTERM (or JAX's preemption notice) once it has committed a checkpoint of the
# step it finished, and the same command resumes from there. Any other status ends the loop with it:
# 0 (done), 130 (a person pressed Ctrl-C: the run saved, but they meant to stop), 1 (an error).
#
# This is the process-level loop, for one machine, a GPU node or a scheduler's job step. On Cloud TPU
# a preemption takes the VM away: babysit.sh recreates it and relaunches the command instead.
#
# Signals sent to this script are passed on to the command (which runs in a process group of its own,
# so a Ctrl-C in the terminal reaches it once, through here), and no rerun follows; a second signal
# reaches it too, and the trainer then exits at once.
set -euo pipefail
SCRIPT_NAME=${0##*/}

usage() {
  cat <<EOF
Usage: $SCRIPT_NAME [options] -- COMMAND [ARGS...]

Run COMMAND; while it exits with the resumable status (75: stopped by SIGTERM or a preemption
notice after saving a checkpoint), run it again after a pause. Stop on any other status.

  --max-retries N         reruns at most (default: 10)
  --backoff SEC           pause before the first rerun, doubled before each next one (default: 30)
  --max-backoff SEC       upper bound of the pause (default: 600)
  --resumable-status S    the status that asks for a rerun (default: 75)

Exit status: COMMAND's last status (75 when the reruns are exhausted), or 2 for bad usage.

Example:
  $SCRIPT_NAME --max-retries 20 -- python -m jaxrl_llm.train --config=configs/tiny.py --workdir=/tmp/run1
EOF
}

die() {
  printf '%s: error: %s\n' "$SCRIPT_NAME" "$*" >&2
  exit 2
}

note() {
  printf '%s: [%s] %s\n' "$SCRIPT_NAME" "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "$*" >&2
}

check_uint() {  # check_uint FLAG VALUE
  [[ $2 =~ ^[0-9]+$ ]] || die "$1 must be a non-negative integer, got '$2'"
}

MAX_RETRIES=10
BACKOFF=30
MAX_BACKOFF=600
RESUMABLE=75

while (($#)); do
  case $1 in
    --) shift; break ;;
    --*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}"; continue ;;
    -h|--help) usage; exit 0 ;;
    --max-retries|--backoff|--max-backoff|--resumable-status)
      (($# >= 2)) || die "$1 needs a value"
      case $1 in
        --max-retries) MAX_RETRIES=$2 ;;
        --backoff) BACKOFF=$2 ;;
        --max-backoff) MAX_BACKOFF=$2 ;;
        *) RESUMABLE=$2 ;;
      esac
      check_uint "$1" "$2"
      shift 2 ;;
    *) die "unknown argument '$1' (the command goes after --)" ;;
  esac
done
(($#)) || die "no command given (put it after --)"
((RESUMABLE >= 1 && RESUMABLE <= 255)) || die "--resumable-status must be in [1, 255], got $RESUMABLE"

STOPPING=0
CHILD=""
forward() {  # forward SIGNAL: pass it on to the command; no rerun afterwards
  STOPPING=1
  if [[ -n $CHILD ]]; then kill -s "$1" "$CHILD" 2>/dev/null || true; fi
}
trap 'forward TERM' TERM
trap 'forward INT' INT

set -m  # background jobs get their own process group: a terminal's Ctrl-C reaches the command once
attempt=0
pause=$BACKOFF
while :; do
  "$@" &
  CHILD=$!
  status=0
  # `wait` returns early (status > 128) when a trapped signal arrives: wait again for the real status.
  while :; do
    wait "$CHILD" && status=0 || status=$?
    kill -0 "$CHILD" 2>/dev/null || break
  done
  CHILD=""
  if ((status != RESUMABLE)); then
    exit "$status"
  fi
  if ((STOPPING)); then
    note "the command stopped resumably after a signal sent to $SCRIPT_NAME: not rerunning it"
    exit "$status"
  fi
  if ((attempt >= MAX_RETRIES)); then
    note "giving up: the command stopped resumably (status $status) and was rerun $MAX_RETRIES times (--max-retries)"
    exit "$status"
  fi
  attempt=$((attempt + 1))
  note "the command stopped resumably (status $status); rerun $attempt of at most $MAX_RETRIES in $pause s"
  sleep "$pause" &
  wait $! || true
  if ((STOPPING)); then
    note "signalled during the pause: not rerunning"
    exit "$status"
  fi
  pause=$((pause * 2 > MAX_BACKOFF ? MAX_BACKOFF : pause * 2))
done
