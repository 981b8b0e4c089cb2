#!/usr/bin/env bash
# Issue 17 (a)'s comparison: the same suite tasks at the large preset run one at a time and then
# several in flight, each through a fresh daemon (scripts/device/suite.sh), in one device call.
# Builds nothing: carry target/release/kforge and target/release/libkforge_shim.so.
#
#   bash scripts/device/serial_compare.sh            (the default sample below)
#   TASKS="verify-eager:problems/level1/015*.py inspect:default:problems/level1/015*.py" bash scripts/device/serial_compare.sh
#
# Each phase gets its own Inductor and Triton caches (nothing compiled in the serial phase is
# reused by the parallel one; the FX graph cache is off in suite.sh anyway). The serial phase
# runs first with PARALLEL=1, then the same tasks with PARALLEL=$IN_FLIGHT (default 4). A phase
# starts no task after its deadline (SERIAL_DEADLINE_S, PARALLEL_DEADLINE_S); the comparison
# uses the tasks both phases finished.
# $OUT gets serial/{suite.tgz,summary.json}, parallel/{suite.tgz,summary.json} and compare.json,
# and the table is printed last.
set -uo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT/serial" "$OUT/parallel"
SAMPLE="problems/level1/01[56]*.py problems/level2/00[16]*.py problems/level3/005*.py"
if [ -z "${TASKS:-}" ]; then
  TASKS=""
  for g in $SAMPLE; do TASKS="$TASKS verify-eager:$g inspect:default:$g"; done
fi
C=$(mktemp -d /tmp/kforge-compare.XXXXXX)
phase() {  # NAME PARALLEL DEADLINE
  mkdir -p "$C/$1/inductor" "$C/$1/triton"
  # shellcheck disable=SC2086  # TASKS is a list of words
  OUT=$OUT/$1 SIZE=large PARALLEL=$2 INTERLEAVE=1 DEADLINE_S=$3 TORCHINDUCTOR_CACHE_DIR=$C/$1/inductor \
    TRITON_CACHE_DIR=$C/$1/triton bash scripts/device/suite.sh $TASKS >"$C/$1.out" 2>&1
  rc=$?
  echo "$1: exit $rc, $(grep -m1 ' tasks in ' "$C/$1.out")"
  [ $rc = 0 ] || tail -20 "$C/$1.out"
}
phase serial 1 "${SERIAL_DEADLINE_S:-300}"
phase parallel "${IN_FLIGHT:-4}" "${PARALLEL_DEADLINE_S:-200}"
python3 scripts/device/serial_compare.py "$OUT/serial/summary.json" "$OUT/parallel/summary.json" "$OUT/compare.json"
