#!/usr/bin/env bash
# Runs scripts/device/eval.sh in the background on the device machine, so that a plan longer than
# one device call (10 min) runs without a break: the job lives in its own process session and
# goes on between calls for as long as the machine is held (keep the calls chained within its
# idle release).
#
#   bash scripts/device/eval-bg.sh start [STATE_DIR] -- STEP [STEP...]
#       copy the binaries and eval.sh to /tmp/kf (later calls re-copy the working tree; a running
#       job must not read files that change under it) and start eval.sh on STATE_DIR (may be
#       absent: a fresh state) with the steps; returns at once
#   bash scripts/device/eval-bg.sh poll SECONDS
#       wait until the job ends or SECONDS pass, then copy the latest state.tgz and the log to
#       $OUT and print the log's end
set -euo pipefail
OUT=${OUT:-/tmp/kforge-out}
JOB=/tmp/kf
case "${1:-}" in
  start)
    shift
    state=/nonexistent
    if [ -n "${1:-}" ] && [ "$1" != -- ]; then state=$(realpath -m "$1"); shift; fi
    [ "${1:-}" = -- ] && shift
    [ $# -gt 0 ] || { echo "eval-bg.sh start: no steps given (start [STATE_DIR] -- STEP...)"; exit 2; }
    if [ -e "$JOB/pid" ] && kill -0 "$(cat "$JOB/pid")" 2>/dev/null; then
      echo "a job is already running (pid $(cat "$JOB/pid"))"; exit 2
    fi
    rm -rf "$JOB"; mkdir -p "$JOB/target/release" "$JOB/scripts/device" "$JOB/out"
    cp target/release/kforge target/release/libkforge_shim.so "$JOB/target/release/"
    cp scripts/device/eval.sh "$JOB/scripts/device/"
    [ -d "$state" ] && cp -r "$state" "$JOB/state0"
    cd "$JOB"
    setsid bash -c 'OUT=/tmp/kf/out bash scripts/device/eval.sh "$@" > /tmp/kf/log 2>&1; echo $? > /tmp/kf/rc' \
      eval "$JOB/state0" "$@" < /dev/null > /dev/null 2>&1 &
    echo $! > "$JOB/pid"
    echo "started pid $(cat "$JOB/pid") at $(date +%T): $*"
    ;;
  poll)
    limit=${2:?seconds}
    [ -e "$JOB/log" ] || { echo "eval-bg.sh poll: no job was started on this machine (a fresh machine: start again)"; exit 2; }
    t0=$(date +%s)
    while [ ! -e "$JOB/rc" ] && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do sleep 5; done
    [ -e "$JOB/out/state.tgz" ] && cp "$JOB/out/state.tgz" "$OUT/"
    cp "$JOB/log" "$OUT/eval-log.txt" 2>/dev/null || true
    for f in report.json report.html; do [ -e "$JOB/out/$f" ] && cp "$JOB/out/$f" "$OUT/"; done
    grep '^== ' "$JOB/log" | tail -n 20 || true
    echo "--- log end"
    tail -n 15 "$JOB/log"
    if [ -e "$JOB/rc" ]; then echo "job ended: rc $(cat "$JOB/rc")"; else echo "job still running at $(date +%T)"; fi
    ;;
  *) echo "usage: eval-bg.sh start [STATE_DIR] -- STEP... | poll SECONDS"; exit 2 ;;
esac
