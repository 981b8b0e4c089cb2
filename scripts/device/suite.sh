#!/usr/bin/env bash
# Issues 6 and 7 in one device call: a kforge daemon over every GPU, then `kforge inspect --daemon`
# over the problem suite and `kforge verify --daemon` over the candidate corpus, several tasks
# in flight (compiles overlap; profiles and timings run in exclusive regions).
# Builds nothing there: carry target/release/kforge and target/release/libkforge_shim.so.
#
#   bash scripts/device/suite.sh TASK...     (TASK: inspect:MODE[:GLOB] | verify; see suite.py)
#
# Env: PARALLEL, DEADLINE_S (default 540: no task starts later), SKIP (done.txt of an earlier call),
# FREEZE (node, default: a region freezes every other task, those of the other GPU too; or device),
# REGION_CPUS (the region holders' cpus, e.g. 8,9; default the two lowest-numbered cores).
# Writes $OUT/suite.tgz (per task: capture, report or verdict JSON and log; the daemon's store and
# log) after every task, $OUT/summary.json, and prints the tables last.
set -uo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
K=$PWD/target/release/kforge
test -x "$K" || { echo "carry target/release/kforge"; exit 2; }
W=$(mktemp -d /tmp/kforge-suite.XXXXXX)
S=$W/k.sock
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_FX_GRAPH_CACHE=0 TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-4}
nvidia-smi -L
NGPU=$(nvidia-smi -L | grep -c '^GPU')
export NGPU
PER_GPU=${PER_GPU:-6}
CORES=(--reserve-cores 2)
[ -n "${REGION_CPUS:-}" ] && CORES=(--region-cpus "$REGION_CPUS")
setsid "$K" --socket "$S" daemon --db "$W/store.db" "${CORES[@]}" --freeze "${FREEZE:-node}" --max-concurrent "$PER_GPU" >"$W/daemon.log" 2>&1 &
for _ in $(seq 200); do "$K" --socket "$S" status >/dev/null 2>&1 && break; sleep 0.05; done
"$K" --socket "$S" status | head -20
# The Python package runs from the binary (embedded at build time): a binary built before the last
# change to python/kforge would run old code. Refuse it.
if ! diff -rq --exclude=__pycache__ python/kforge "$S.d/python/kforge" >/dev/null; then
  diff -rq --exclude=__pycache__ python/kforge "$S.d/python/kforge" | head
  echo "target/release/kforge embeds another python/kforge than this tree: rebuild (cargo build --release) and carry it"
  "$K" --socket "$S" shutdown >/dev/null 2>&1; exit 2
fi
python3 scripts/device/suite.py "$K" "$S" "$W" "$OUT" "$@"
rc=$?
"$K" --socket "$S" shutdown >/dev/null 2>&1 || true
# The last pack, with the stopped daemon's store: written beside, then renamed over the last good one.
FINAL_PACK=1 python3 scripts/device/suite.py "$K" "$S" "$W" "$OUT"
exit $rc
