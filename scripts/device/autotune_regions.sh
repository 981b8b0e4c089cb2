#!/usr/bin/env bash
# Inductor's own autotuning inside regions (issue 18 item 4) on a real GPU; builds nothing.
# Needs target/release/kforge and target/release/libkforge_shim.so carried (built from this tree).
#   Each problem of PROBLEMS is compiled with torch.compile(mode="max-autotune") by
#   scripts/device/autotune_choices.py as a daemon job on GPU 0, every compile with a fresh
#   Inductor cache (TORCHINDUCTOR_CACHE_DIR of its own: no compile reuses another's choices):
#     alone.P.r  each problem alone on the GPU, ALONE_REPEATS times (r = 1..; the reference; with
#                2 or more, how often two isolated compiles agree: the autotuning's own noise);
#     plain.i    N compiles at once (problems cycled over i = 1..N), no flag: Inductor's
#                benchmarks share the GPU with the other compiles;
#     auto.i     the same N at once with --auto-regions: each Inductor benchmark in a region;
#     step.i     (STEP=1) the same N at once, no flag, the driver calling
#                kforge.autoregions.inductor_regions() before compiling (what optimize's steps do).
#   Per compile the choices (select_algorithm's winner per op, the heuristics' winning config per
#   Triton kernel, coordinate descent's, the *.best_config files) against the isolated compile of
#   the same problem (alone.P.1): identical or not, how many differ, and how many of those were
#   close calls in isolation (the runner-up within CLOSE of the winner there); the regions each
#   job entered (by name; from the job's main process or another: the autotune subprocess).
#   Triton's kernel cache stays shared (binaries, not choices); the compiled problem is timed
#   with kforge.do_bench (its own region) in every round.
# SUBPROC=1 sets TORCHINDUCTOR_AUTOTUNE_IN_SUBPROC=1 for every compile (the templates are
# benchmarked in Inductor's autotune subprocess; its regions come from another pid).
# $OUT gets autotune_regions.json (the summary), autotune_regions.txt (the table, printed last)
# and autotune_regions.tgz (daemon.log, each compile's output and JSON, report.json, exits.txt).
# Time: about one isolated compile per problem and repeat plus 2-3 parallel rounds of the slowest
# problem's compile under contention; with the defaults (3 problems, N=4) expect 6-9 min on an
# H200; PROBLEMS/N/ALONE_REPEATS shrink it. Each compile is a job with --timeout JOB_TIMEOUT_S.
set -uo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
N=${N:-4}
ALONE_REPEATS=${ALONE_REPEATS:-1}
JOB_TIMEOUT_S=${JOB_TIMEOUT_S:-300}
SUBPROC=${SUBPROC:-0}
STEP=${STEP:-0}
CLOSE=${CLOSE:-0.03}
PROBLEMS=${PROBLEMS:-"problems/level1/001_matmul_square_fp32.py problems/level2/001_gemm_bias_relu_fp32.py problems/level3/001_mlp_block_fp32.py"}
K=$PWD/target/release/kforge
test -x "$K" && test -f target/release/libkforge_shim.so || { echo "carry target/release/kforge and target/release/libkforge_shim.so"; exit 2; }
W=$(mktemp -d /tmp/kforge-autotune.XXXXXX)
S=$W/k.sock
D=$PWD/scripts/device
L=$W/files  # what goes into autotune_regions.tgz
mkdir -p "$L" "$W/cache"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
[ "$SUBPROC" = 1 ] && export TORCHINDUCTOR_AUTOTUNE_IN_SUBPROC=1
nvidia-smi -L | tee "$L/gpu.txt"
setsid "$K" --socket "$S" daemon --db "$W/autotune.db" --reserve-cores 2 --warm-workers 0 >"$L/daemon.log" 2>&1 &
# The daemon is a background job of this shell: never `wait` for all jobs; shut it down on exit.
trap '"$K" --socket "$S" shutdown >/dev/null 2>&1 || true' EXIT
for _ in $(seq 200); do "$K" --socket "$S" status >/dev/null 2>&1 && break; sleep 0.05; done
"$K" --socket "$S" status | head -8

read -r -a PROBS <<<"$PROBLEMS"
compile_job() { # TAG PROBLEM [kforge run FLAGS...] [-- DRIVER FLAGS...]: one compile, one job
  local tag=$1 prob=$2; shift 2
  local flags=() extra=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do flags+=("$1"); shift; done
  [ $# -gt 0 ] && { shift; extra=("$@"); }
  mkdir -p "$W/cache/$tag"
  TORCHINDUCTOR_CACHE_DIR=$W/cache/$tag "$K" --socket "$S" run --device 0 --label "$tag" --gpu-memory 8 \
    --timeout "$JOB_TIMEOUT_S" "${flags[@]}" -- python3 "$D/autotune_choices.py" "$prob" "$W/$tag.json" "${extra[@]}" \
    >"$L/$tag.txt" 2>&1
  echo "$tag exit $?" >>"$W/exits.txt"
  tail -1 "$L/$tag.txt"
}
parallel_round() { # RUN [FLAGS...]: N compiles at once, problems cycled
  local run=$1; shift
  echo "== $run: $N compiles at once ($(date +%T))"
  local pids=() i
  for i in $(seq "$N"); do
    compile_job "$run.$i" "${PROBS[$(( (i - 1) % ${#PROBS[@]} ))]}" "$@" &
    pids+=($!)
  done
  wait "${pids[@]}"
}

t0=$(date +%s)
for p in "${!PROBS[@]}"; do
  for r in $(seq "$ALONE_REPEATS"); do
    echo "== alone.$p.$r ${PROBS[$p]} ($(date +%T))"
    compile_job "alone.$p.$r" "${PROBS[$p]}"
  done
done
parallel_round plain
parallel_round auto --auto-regions
[ "$STEP" = 1 ] && parallel_round step -- --step
"$K" --socket "$S" report --json >"$W/report.json"
"$K" --socket "$S" shutdown >/dev/null 2>&1 || true
python3 - "$W/meta.json" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "$(( $(date +%s) - t0 ))" \
  "$PROBLEMS" "$N" "$ALONE_REPEATS" "$SUBPROC" "$CLOSE" <<'PY'
import json, sys
json.dump({"rev": sys.argv[2], "wall_s_total": int(sys.argv[3]), "problems": sys.argv[4].split(), "n": int(sys.argv[5]),
           "alone_repeats": int(sys.argv[6]), "subproc": sys.argv[7] == "1", "close": float(sys.argv[8]),
           "command": "bash scripts/device/autotune_regions.sh"}, open(sys.argv[1], "w"))
PY
cp "$W"/exits.txt "$W"/*.json "$L"/ 2>/dev/null
tar -czf "$OUT/autotune_regions.tgz" -C "$L" .
python3 "$D/autotune_regions_summary.py" "$W" "$OUT/autotune_regions.json" | tee "$OUT/autotune_regions.txt"
