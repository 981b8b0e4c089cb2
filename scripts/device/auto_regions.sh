#!/usr/bin/env bash
# `kforge run --auto-regions` on a real GPU, one device call (< 4 min on an H200); builds nothing.
# Needs target/release/kforge and target/release/libkforge_shim.so carried (built from this tree).
#   The unmodified KernelBench-style eval scripts/device/kb_style_eval.py (matmul and swish, each
#   timed with triton.testing.do_bench, per-trial CUDA events, an event loop and torch.utils.benchmark.Timer) runs four times
#   on one daemon, GPU 0:
#     alone        nothing else on the GPU, no flag;
#     alone-auto   nothing else on the GPU, --auto-regions (what the regions cost when alone);
#     beside       next to 3 competing bf16 8192^3 matmul loops (jobs of the same daemon that
#                  have run for HEAT_S s), no flag: the script's timing shares the GPU;
#     beside-auto  the same competitors, --auto-regions: each timed call inside a region.
#   Inflation = a series' p50 (p95) over the same series' p50 (p95) in `alone`.
# $OUT gets three files (a device call returns at most 8): auto_regions.json (the summary),
# auto_regions.txt (the table, also printed last) and auto_regions.tgz (everything else: gpu.txt,
# daemon.log, RUN.txt (each eval's output, with its progress lines), RUN.json, exits.txt,
# report.json (the store dump: every region's gate/drain/freeze/settle times), meta.json).
# Total < 3 min: each eval is a job with --timeout EVAL_TIMEOUT_S (default 60 s).
set -uo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
HEAT_S=${HEAT_S:-3}
EVAL_TIMEOUT_S=${EVAL_TIMEOUT_S:-60}
K=$PWD/target/release/kforge
test -x "$K" && test -f target/release/libkforge_shim.so || { echo "carry target/release/kforge and target/release/libkforge_shim.so"; exit 2; }
W=$(mktemp -d /tmp/kforge-auto.XXXXXX)
S=$W/k.sock
D=$PWD/scripts/device
L=$W/files  # what goes into auto_regions.tgz
mkdir -p "$L"
export PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$L/gpu.txt"
setsid "$K" --socket "$S" daemon --db "$W/auto.db" --reserve-cores 2 --warm-workers 0 >"$L/daemon.log" 2>&1 &
# The daemon is a background job of this shell: never `wait` for all jobs; shut it down on exit.
trap '"$K" --socket "$S" shutdown >/dev/null 2>&1 || true' EXIT
for _ in $(seq 200); do "$K" --socket "$S" status >/dev/null 2>&1 && break; sleep 0.05; done
"$K" --socket "$S" status | head -8

CPIDS=()
competitors() { # start 3 competitors, return when all submit work
  rm -f "$W"/ready.*
  CPIDS=()
  for i in 1 2 3; do
    "$K" --socket "$S" run --device 0 --label "competitor" --gpu-memory 2 -- python3 "$D/competitor.py" "$W/ready.$i" >/dev/null 2>&1 &
    CPIDS+=($!)
  done
  for _ in $(seq 900); do [ "$(ls "$W"/ready.* 2>/dev/null | wc -l)" = 3 ] && return 0; sleep 0.1; done
  echo "competitors did not start within 90 s"; "$K" --socket "$S" status; return 1
}
stop_competitors() { # a lost client cancels its job; poll the daemon until they are gone
  kill "${CPIDS[@]}" 2>/dev/null || true
  for _ in $(seq 600); do "$K" --socket "$S" status | grep -q "competitor" || return 0; sleep 0.05; done
}
eval_run() { # RUN [FLAGS...]: the unmodified eval as one job; its output in RUN.txt
  local run=$1; shift
  echo "== $run ($(date +%T))"
  "$K" --socket "$S" run --device 0 --label "$run" --gpu-memory 4 --timeout "$EVAL_TIMEOUT_S" "$@" -- \
    python3 "$D/kb_style_eval.py" "$run" "$W/$run.json" 2>&1 | tee "$L/$run.txt"
  echo "$run exit ${PIPESTATUS[0]}" | tee -a "$W/exits.txt"
}

t0=$(date +%s)
eval_run alone
eval_run alone-auto --auto-regions
if competitors; then
  sleep "$HEAT_S"
  eval_run beside
  eval_run beside-auto --auto-regions
  stop_competitors
fi
"$K" --socket "$S" report --json >"$W/report.json"
"$K" --socket "$S" shutdown >/dev/null 2>&1 || true
python3 - "$W/meta.json" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "$(( $(date +%s) - t0 ))" <<'PY'
import json, sys
json.dump({"rev": sys.argv[2], "wall_s_total": int(sys.argv[3]), "command": "bash scripts/device/auto_regions.sh"},
          open(sys.argv[1], "w"))
PY
cp "$W"/exits.txt "$W"/*.json "$L"/ 2>/dev/null
tar -czf "$OUT/auto_regions.tgz" -C "$L" .
python3 "$D/auto_regions_summary.py" "$W" "$OUT/auto_regions.json" | tee "$OUT/auto_regions.txt"
