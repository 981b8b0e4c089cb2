#!/usr/bin/env bash
# Compile workers on a real GPU (PENDING item 10), one device call (about 6-8 min); builds nothing.
#
# A level-3 measure step as `kforge optimize --agents dispatch,inductor,rewrite` runs it (the
# dispatch modes, the six knobs, the rewrite, per-graph rounds; max-autotune the baseline), alone
# on the GPU (no daemon), Inductor's and Triton's caches cold: once with `--compile-workers 0`,
# once with WORKERS. Per run: the step's wall seconds, the seconds it spent preparing variants (the
# step's own `prepared X in S s` lines, waits for workers included), how many warmed variants hit
# the FX graph cache, and the winner with its speedup (workers change how fast variants compile,
# never what is timed: the two winners should agree up to the measurement's noise).
#
# Override: PROBLEMS (paths, space-separated; default level-3 002 and 006, measure steps of 244 and
# 246 s at 4 in flight in the H100 campaign), WORKERS (3: what `kforge optimize` passes at
# `--jobs 4` on 16 cores), DEADLINE_S (no run starts after it, default 480), DEVICE (cuda;
# `DEVICE=cpu` checks the script without a GPU). $OUT gets compile_workers.json (one row per run)
# and compile_workers.txt (the table, printed last); the runs' logs go to compile_workers.tgz.
set -uo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
PROBLEMS=${PROBLEMS:-"problems/level3/002_multihead_attention_bf16.py problems/level3/006_small_cnn_classifier_bf16.py"}
WORKERS=${WORKERS:-3}
DEADLINE_S=${DEADLINE_S:-480}
DEVICE=${DEVICE:-cuda}
START=$(date +%s)
W=$(mktemp -d /tmp/kforge-cw.XXXXXX)
mkdir -p "$W/runs"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
if [ "$DEVICE" = cpu ]; then
  MODES=eager,default,max-autotune-no-cudagraphs; KNOBS=freezing,aggressive-fusion; BASELINE=default
else
  MODES=eager,default,max-autotune,max-autotune-no-cudagraphs,reduce-overhead
  KNOBS=freezing,aggressive-fusion,coordinate-descent,no-layout-optimization,max-autotune-pointwise,no-epilogue-fusion
  BASELINE=max-autotune
fi
now() { python3 -c 'import time; print(f"{time.time():.3f}")'; }
for p in $PROBLEMS; do
  name=$(basename "$p" .py)
  for w in 0 "$WORKERS"; do
    if [ $(( $(date +%s) - START )) -gt "$DEADLINE_S" ]; then echo "$name workers=$w: not started (DEADLINE_S)"; continue; fi
    cache=$W/cache-$name-$w  # cold: each run its own Inductor and Triton caches
    t0=$(now)
    TORCHINDUCTOR_CACHE_DIR=$cache TRITON_CACHE_DIR=$cache/triton \
      python3 -m kforge.optimize.dispatch "$p" --out "$W/runs/$name.w$w.json" --device "$DEVICE" \
      --baseline "$BASELINE" --modes "$MODES" --knobs "$KNOBS" --rewrite exact,reassociates --graph-rounds 2 \
      --rounds 5 --compile-workers "$w" 2>"$W/runs/$name.w$w.log"
    rc=$?
    echo "{\"problem\": \"$name\", \"workers\": $w, \"rc\": $rc, \"started\": $t0, \"ended\": $(now)}" >>"$W/runs/walls.jsonl"
    echo "$name workers=$w rc=$rc"
    rm -rf "$cache"
  done
done
tar czf "$OUT/compile_workers.tgz" -C "$W" runs
python3 scripts/device/compile_workers_summary.py "$W/runs" "$OUT/compile_workers.json" | tee "$OUT/compile_workers.txt"
rm -rf "$W"
