#!/usr/bin/env bash
# Issue 17's remaining H200 runs that each take a few minutes, in one device call (a machine start
# costs ~100 s of held time; the runs stay apart, one after another, never overlapping):
#   1. verify at the large preset, the suite candidates (verify_scale.sh, SKIP_NAIVE=1: the naive
#      harness figures of rev 8e0fda6 stand; kforge verify alone is re-measured);
#   2. the four presets resized from their measurements (large_preset_times.py);
#   3. the candidate corpus (suite.sh verify, 6 in flight on one daemon);
#   4. --auto-regions beside competitors (auto_regions.sh).
#
#   bash scripts/device/acceptance17.sh [PART...]     PART: scale presets corpus auto (default: all)
#
# Each part writes into $OUT/PART/; the part's folder is packed to $OUT/PART.tgz and its summary
# JSON copied to $OUT (a device call returns at most 8 files). Tables are printed last.
set -uo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
test -x target/release/kforge || { echo "carry target/release/kforge"; exit 2; }
PARTS=${*:-scale presets corpus auto}
T0=$(date +%s)
for part in $PARTS; do
  mkdir -p "$OUT/$part"
  echo "== $part ($(( $(date +%s) - T0 )) s in)"
  case $part in
    scale) OUT=$OUT/$part SKIP_NAIVE=1 bash scripts/device/verify_scale.sh silu_bf16 gelu_fp32 softmax_fp32 layernorm_fp32 gemm_bias_gelu_bf16 >"$OUT/$part/table.txt" 2>&1
           cp "$OUT/$part/verify_scale.json" "$OUT/" ;;
    presets) python3 scripts/device/large_preset_times.py "$OUT/large_times.json" problems/level1/006_sum_middle_dim_fp32.py \
               problems/level1/010_rmsnorm_bf16.py problems/level3/008_gru_unrolled_fp32.py problems/level3/009_lstm_unrolled_bf16.py \
               >"$OUT/$part/table.txt" 2>&1 ;;
    corpus) OUT=$OUT/$part DEADLINE_S=${CORPUS_DEADLINE_S:-150} bash scripts/device/suite.sh verify >"$OUT/$part/table.txt" 2>&1
            cp "$OUT/$part/summary.json" "$OUT/corpus_summary.json" ;;
    auto) OUT=$OUT/$part bash scripts/device/auto_regions.sh >"$OUT/$part/table.txt" 2>&1
          cp "$OUT/$part/auto_regions.json" "$OUT/" ;;
    *) echo "unknown part $part"; continue ;;
  esac
  tar -czf "$OUT/$part.tgz" -C "$OUT" "$part" && rm -rf "${OUT:?}/$part.keep"
  echo "   done in $(( $(date +%s) - T0 )) s"
done
for part in $PARTS; do
  echo; echo "==== $part"
  case $part in
    corpus) grep -E "as expected|tasks in|GPU memory" "$OUT/$part/table.txt"; grep -E " NO$" "$OUT/$part/table.txt" ;;
    *) tail -n 16 "$OUT/$part/table.txt" ;;
  esac
done
# Only the packs and summaries come back: the part folders go.
for part in $PARTS; do rm -rf "${OUT:?}/$part"; done
