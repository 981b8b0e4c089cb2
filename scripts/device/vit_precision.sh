#!/usr/bin/env bash
# Runs vit_precision.py under five settings at once; one JSON line each into $OUT/vit_precision.jsonl.
set -u
OUT=${OUT:-/tmp/vit}; mkdir -p "$OUT"
for s in as-is cudnn-tf32-off conv-aten no-pattern default-mode; do
  TORCHINDUCTOR_CACHE_DIR=/tmp/ind-$s timeout 150 python3 scripts/device/vit_precision.py $s > "$OUT/$s.out" 2> "$OUT/$s.err" &
done
wait
for s in as-is cudnn-tf32-off conv-aten no-pattern default-mode; do
  tail -1 "$OUT/$s.out" >> "$OUT/vit_precision.jsonl" || true
  [ -s "$OUT/$s.out" ] || { echo "$s failed:"; tail -3 "$OUT/$s.err"; }
  rm -f "$OUT/$s.out" "$OUT/$s.err"
done
cat "$OUT/vit_precision.jsonl"
