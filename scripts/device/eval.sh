#!/usr/bin/env bash
# Runtime evaluation on the GPU machine (issue 5), in steps that each fit one device call.
# Builds nothing there: carry target/release/kforge and target/release/libkforge_shim.so, plus
# the state directory of earlier calls (a folder ignored by git, e.g. .eval-state/).
#
#   bash scripts/device/eval.sh STATE_DIR STEP [STEP...]
#     gen[:PER_BUCKET[:SEED]]     generate the gpu workload (default 50 per bucket, seed 1)
#     truth[:OFFSET:LIMIT[:DEVICE]]
#                                 ground truth: each command alone, one at a time, cold like the
#                                 runs (split a long truth over calls with OFFSET/LIMIT), on GPU
#                                 DEVICE (0; another GPU's truth is named truth-gpuN, its store
#                                 kforge-eval-gpuN.db)
#     truth-each[:OFFSET:LIMIT]   the truth on every GPU at once (nvidia-smi -L), each on its own
#                                 equal share of the cores (a machine of several GPUs: every
#                                 command's truth on each GPU, for the scaling run
#                                 `run:region:warm:8::NAME:all`)
#     truth-pair[:OFFSET:LIMIT]   the same on GPUs 0 and 1 only
#     truth-warm[:OFFSET:LIMIT]   the same in one warm worker, manifest truth-warm[-OFFSET] (faster; idle gaps between kernels —
#                                 read the smoke run in bench/results/runtime-eval/README.md, History, before using it)
#     run:POLICY[:ABLATION[:N[:LIMIT[:NAME[:DEVICE[:SETTLE_MS]]]]]]
#                                 run under none|command|region (ablation gate|drain|freeze|isolate|warm),
#                                 N in flight (8), only the first LIMIT commands (env LIMIT, else all),
#                                 manifest NAME.run.json (default POLICY or region-ABLATION, -LIMIT when limited),
#                                 on DEVICE (a GPU index, or all: every GPU, N in flight on each — the
#                                 2×H200 scaling run, each candidate group on one GPU; all-split: the
#                                 same, each command on the least busy GPU (--no-gpu-groups);
#                                 default env RUN_DEVICE, else 0; commands run on
#                                 another GPU than their truth's are compared across GPUs, marked),
#                                 with the settle step at most SETTLE_MS (0: none; default: the
#                                 ablation step's)
#     slice:OFFSET:LIMIT          commands OFFSET..OFFSET+LIMIT: their ground truth, then the runs of
#                                 $SLICE_RUNS (default "command region:isolate region:warm"; each
#                                 POLICY[:ABLATION]) on them, named NAME@OFFSET — one call holds a
#                                 slice's truth and runs on one GPU; `report` merges the slices
#     report                      report.json + report.html over every manifest in the state
#
# Every step rewrites $OUT/state.tgz (the updated state: workload, store, manifests) — unpack it
# into STATE_DIR before the next call — and, after `report`, $OUT/report.{json,html}.
#
# A step whose result the state already holds is skipped (gen: the workload; truth, truth-warm,
# run: their manifest), so every call of a session can be given the whole plan; with DEADLINE_S
# no step starts later than that many seconds after the call began (keep each step a few
# minutes: a step cut off by the call's time limit leaves no manifest).
set -euo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
K=$PWD/target/release/kforge
STATE=$1; shift
W=$(mktemp -d /tmp/kforge-eval.XXXXXX)
[ -d "$STATE" ] && cp -r "$STATE"/. "$W"/
export PYTHONUNBUFFERED=1
nvidia-smi -L
START=$(date +%s)
# The file a step leaves in the state (empty: always run it).
result_of() {
  case "$1" in
    gen) echo w.jsonl ;;
    # kforge names a truth part NAME-OFFSET when it has an offset or a limit.
    truth|truth-warm) echo "$(truth_name "$1" "$4")$( { [ "${2:-0}" != 0 ] || [ -n "$3" ]; } && echo "-${2:-0}").run.json" ;;
    run) echo "$(run_name "$2" "$3" "$5" "$6" "$7" "$8").run.json" ;;
    *) echo "" ;;
  esac
}
# The GPU indices a truth-pair (0 1) or truth-each (every GPU nvidia-smi lists) step covers.
each_gpu() {
  if [ "$1" = truth-pair ]; then echo 0 1; return; fi
  seq 0 $(( $(nvidia-smi -L | grep -c '^GPU ') - 1 ))
}
# A truth's base name: truth, truth-warm, or truth-gpuN for a cold truth on GPU N > 0.
truth_name() {
  if [ "$1" = truth ] && [ -n "$2" ] && [ "$2" != 0 ]; then echo "truth-gpu$2"; else echo "$1"; fi
}
# One cold truth part (offset, limit, GPU), each GPU's in its own store.
truth_part() {
  local dev=${3:-0} extra=()
  [ "$dev" != 0 ] && extra=(--name "truth-gpu$dev" --db "$W/kforge-eval-gpu$dev.db")
  "$K" workload truth "$W/w.jsonl" --device "$dev" --reserve-cores 2 ${1:+--offset "$1"} ${2:+--limit "$2"} "${extra[@]}"
}
# A run's manifest name: NAME, else kforge's default (policy, region-ABLATION), with -LIMIT for a
# limited run, -all-groups, -all-split or -gpuN off GPU 0 and -settleMS with a settle override — so that a short,
# moved or re-settled run is not taken for another.
# Arguments: POLICY ABLATION LIMIT NAME DEVICE SETTLE_MS.
run_name() {
  if [ -n "$4" ]; then echo "$4"; return; fi
  local n=$1 dev=${5:-${RUN_DEVICE:-0}}; [ "$1" = region ] && n="region-${2:-isolate}"
  n="$n${3:+-$3}"
  case "$dev" in 0) ;; all) n="$n-all-groups" ;; all-split) n="$n-all-split" ;; *) n="$n-gpu$dev" ;; esac
  echo "$n${6:+-settle$6}"
}
# Pack the state where the poller of eval-bg.sh never sees it half written.
pack() { tar -C "$W" -czf "$OUT/state.tgz.part" . && mv "$OUT/state.tgz.part" "$OUT/state.tgz"; }
for step in "$@"; do
  IFS=: read -r what a b c d e f g <<<"$step"
  lim=${d:-${LIMIT:-}}
  done_file=$(result_of "$what" "$a" "$b" "$c" "$lim" "$e" "$f" "$g")
  if [ "$what" = truth-pair ] || [ "$what" = truth-each ]; then  # done when every GPU's part is
    done_file=$(result_of truth "$a" "$b" 0)
    for dev in $(each_gpu "$what"); do [ -e "$W/$(result_of truth "$a" "$b" "$dev")" ] || done_file=""; done
  fi
  if [ -n "$done_file" ] && [ -e "$W/$done_file" ]; then
    echo "== $step: done ($done_file in the state)"; continue
  fi
  if [ -n "${DEADLINE_S:-}" ] && [ $(( $(date +%s) - START )) -ge "$DEADLINE_S" ]; then
    echo "== $step and the rest: not started before the deadline (${DEADLINE_S} s): run the call again with the new state"
    break
  fi
  echo "== $step ($(date +%T))"
  case "$what" in
    gen) "$K" workload gen --profile gpu --out "$W/w.jsonl" --per-bucket "${a:-50}" --seed "${b:-1}" ;;
    # A truth with a failed command still writes its manifest (the failures listed in it).
    truth) truth_part "$a" "$b" "$c" || true ;;
    truth-pair|truth-each)  # GPU i on the i-th equal share of the cores; parts already done skipped
      gpus=($(each_gpu "$what")); n=$(nproc)
      [ ${#gpus[@]} -gt 0 ] || { echo "$step: nvidia-smi -L lists no GPU"; exit 2; }
      per=$((n / ${#gpus[@]}))
      pids=()
      for dev in "${gpus[@]}"; do
        [ -e "$W/$(result_of truth "$a" "$b" "$dev")" ] && continue
        cpus="$((dev * per))-$((dev * per + per - 1))"
        [ "$per" -gt 0 ] || cpus="0-$((n - 1))"  # fewer cores than GPUs: all share them
        K="$K" W="$W" taskset -c "$cpus" bash -c "$(declare -f truth_part); truth_part \"\$@\"" _ "$a" "$b" "$dev" > "/tmp/truth-each-$dev.log" 2>&1 &
        pids+=("$!:$dev")
      done
      for p in "${pids[@]}"; do wait "${p%%:*}" || true; cat "/tmp/truth-each-${p##*:}.log"; done ;;
    truth-warm) [ -z "$c" ] || { echo "truth-warm takes no DEVICE (it runs on GPU 0): $step"; exit 2; }
      "$K" workload truth "$W/w.jsonl" --warm --device 0 --reserve-cores 2 ${a:+--offset "$a"} ${b:+--limit "$b"} || true ;;
    run) dev=${f:-${RUN_DEVICE:-0}}; split=(); [ "$dev" = all-split ] && { dev=all; split=(--no-gpu-groups); }
      "$K" workload run "$W/w.jsonl" --policy "$a" ${b:+--ablation "$b"} --concurrency "${c:-8}" --device "$dev" "${split[@]}" --reserve-cores 2 ${lim:+--limit "$lim"} --name "$(run_name "$a" "$b" "$lim" "$e" "$f" "$g")" ${g:+--settle-timeout-ms "$g"} || true ;;
    slice)  # each part skipped when the state holds it
      [ -e "$W/truth-$a.run.json" ] || truth_part "$a" "$b" 0 || true
      pack
      for r in ${SLICE_RUNS:-command region:isolate region:warm}; do
        IFS=: read -r pol abl <<<"$r"
        [ -e "$W/${pol}${abl:+-$abl}@$a.run.json" ] && continue
        "$K" workload run "$W/w.jsonl" --policy "$pol" ${abl:+--ablation "$abl"} --concurrency 8 --device 0 --reserve-cores 2 \
          --offset "$a" --limit "$b" --name "${pol}${abl:+-$abl}@$a" || true
        pack
      done ;;
    report) "$K" report "$W"/*.run.json --json "$OUT/report.json" --html "$OUT/report.html" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
  pack   # after every step: a call cut short keeps what it finished
done
pack     # also when every step was skipped
ls -la "$W"
