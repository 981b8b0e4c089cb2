#!/usr/bin/env bash
# Runtime evaluation on the GPU machine (issue 5), in steps that each fit one device call.
# Builds nothing there: carry target/release/kforge and target/release/libkforge_shim.so, plus
# the state directory of earlier calls (a folder ignored by git, e.g. .eval-state/).
#
#   bash scripts/device/eval.sh STATE_DIR STEP [STEP...]
#     gen[:PER_BUCKET[:SEED]]     generate the gpu workload (default 50 per bucket, seed 1)
#     truth[:OFFSET:LIMIT]        ground truth: each command alone, one at a time, cold like the
#                                 runs (split a long truth over calls with OFFSET/LIMIT)
#     truth-warm[:OFFSET:LIMIT]   the same in one warm worker, manifest truth-warm[-OFFSET] (faster; idle gaps between kernels —
#                                 read bench/results/2026-11-30-issue5-eval-smoke before using it)
#     run:POLICY[:ABLATION[:N[:LIMIT[:NAME]]]]
#                                 run under none|command|region (ablation gate|drain|freeze|isolate|warm),
#                                 N in flight (8), only the first LIMIT commands (env LIMIT, else all),
#                                 manifest NAME.run.json (default POLICY-ABLATION)
#                                 (env RUN_DEVICE=all: every GPU, N in flight on each — the
#                                 2×H200 scaling run; its commands are compared with truth across GPUs)
#     slice:OFFSET:LIMIT          commands OFFSET..OFFSET+LIMIT: their ground truth, then the runs of
#                                 $SLICE_RUNS (default "command region:isolate region:warm"; each
#                                 POLICY[:ABLATION]) on them, named NAME@OFFSET — one call holds a
#                                 slice's truth and runs on one GPU; `report` merges the slices
#     report                      report.json + report.html over every manifest in the state
#
# Every step rewrites $OUT/state.tgz (the updated state: workload, store, manifests) — unpack it
# into STATE_DIR before the next call — and, after `report`, $OUT/report.{json,html}.
set -euo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
K=$PWD/target/release/kforge
STATE=$1; shift
W=$(mktemp -d /tmp/kforge-eval.XXXXXX)
[ -d "$STATE" ] && cp -r "$STATE"/. "$W"/
export PYTHONUNBUFFERED=1
nvidia-smi -L
for step in "$@"; do
  IFS=: read -r what a b c d e <<<"$step"
  lim=${d:-${LIMIT:-}}
  echo "== $step ($(date +%T))"
  case "$what" in
    gen) "$K" workload gen --profile gpu --out "$W/w.jsonl" --per-bucket "${a:-50}" --seed "${b:-1}" ;;
    truth) "$K" workload truth "$W/w.jsonl" --device 0 --reserve-cores 2 ${a:+--offset "$a"} ${b:+--limit "$b"} ;;
    truth-warm) "$K" workload truth "$W/w.jsonl" --warm --device 0 --reserve-cores 2 ${a:+--offset "$a"} ${b:+--limit "$b"} ;;
    run) "$K" workload run "$W/w.jsonl" --policy "$a" ${b:+--ablation "$b"} --concurrency "${c:-8}" --device "${RUN_DEVICE:-0}" --reserve-cores 2 ${lim:+--limit "$lim"} ${e:+--name "$e"} || true ;;
    slice)
      "$K" workload truth "$W/w.jsonl" --device 0 --reserve-cores 2 --offset "$a" --limit "$b"
      for r in ${SLICE_RUNS:-command region:isolate region:warm}; do
        IFS=: read -r pol abl <<<"$r"
        "$K" workload run "$W/w.jsonl" --policy "$pol" ${abl:+--ablation "$abl"} --concurrency 8 --device 0 --reserve-cores 2 \
          --offset "$a" --limit "$b" --name "${pol}${abl:+-$abl}@$a" || true
        tar -C "$W" -czf "$OUT/state.tgz" .
      done ;;
    report) "$K" report "$W"/*.run.json --json "$OUT/report.json" --html "$OUT/report.html" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  tar -C "$W" -czf "$OUT/state.tgz" .   # after every step: a call cut short keeps what it finished
done
ls -la "$W"
