#!/usr/bin/env bash
# kforge verify's wall time at the large preset against a naive single-seed harness
# (scripts/device/naive_harness.py: allclose + triton.testing.do_bench), per suite candidate.
#
#   bash scripts/device/verify_scale.sh NAME...     NAME: a file stem of tests/candidates/suite/,
#                                                   or eager:GLOB (every problem of GLOB, e.g.
#                                                   eager:'problems/level1/*.py', against its own
#                                                   eager forward: the dispatch agent's "eager"
#                                                   result file and its policy.toml)
#
# DEADLINE_S: no candidate starts after this many seconds (a device call is 10 min); SKIP: a file
# of names done by an earlier call (the names this call finished are in $OUT/done.txt).
# For each candidate: the naive harness with host inputs (KernelBench's practice) and with
# device inputs (the fastest naive harness), then `kforge verify PROBLEM CANDIDATE --size large`
# (the whole cascade, standalone), each process timed whole. Peak GPU memory of the GPU is
# sampled with nvidia-smi every 0.5 s during the verify. VERIFY_AGAIN=1: verify once more (a
# search verifies many candidates of one problem: Inductor's caches are then warm). SKIP_NAIVE=1:
# kforge verify only; NAIVE_INPUTS=device: the device-input naive harness only. WARM=1: also
# `kforge verify --daemon --warm` through a daemon whose one warm worker forks each runner
# (`--worker-fork`, torch, Triton, Dynamo, Inductor and the runner's modules preloaded: the start-up a
# fresh verify pays, skipped), as "verify-warm". WARM_ONLY=1: the warm verify alone (no cold
# one; with the naive harness, whose run is the warm verify's own ratio's), for rows whose cold
# verify an earlier call made: SKIP then lists the rows with a warm verdict (`verify_scale_merge.py
# done --warm`), and $OUT/done.txt the names whose warm verify finished. Each warm verify then finds
# Inductor's cache cold for its problem (no cold verify compiled it first). Writes $OUT/verify_scale.json (with
# every verdict's JSON) and prints a table last. Needs target/release/kforge carried (and with
# WARM=1 target/release/libkforge_shim.so).
set -uo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
test -x target/release/kforge || { echo "carry target/release/kforge"; exit 2; }
[ $# -gt 0 ] || { echo "usage: verify_scale.sh NAME... (stems of tests/candidates/suite/*.py, or eager:GLOB)"; exit 2; }
declare -A PROBLEM=(
  [silu_bf16]=problems/level1/016_silu_bf16.py
  [gelu_fp32]=problems/level1/015_gelu_erf_fp32.py
  [softmax_fp32]=problems/level1/013_softmax_fp32.py
  [layernorm_fp32]=problems/level1/009_layernorm_fp32.py
  [gemm_bias_gelu_bf16]=problems/level2/002_gemm_bias_gelu_bf16.py
)
W=$(mktemp -d /tmp/kforge-vscale.XXXXXX)
: >"$W/walls.txt"
# The GPU's name, in every row (a problem's rows may come from calls on different GPUs).
nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 >"$W/gpu.txt" || true
now() { date +%s.%N; }
summarize() {  # quiet | table: $OUT/verify_scale.json from what ran so far; the table with "table"
python3 - "$W" "$OUT/verify_scale.json" "$1" <<'PY'
import json, os, sys
w, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
rows = {}
gpu = open(os.path.join(w, "gpu.txt")).read().strip() or None
for line in open(os.path.join(w, "walls.txt")):
    name, what, rc, secs = line.split()
    r = rows.setdefault(name, {"name": name, "gpu": gpu})
    r[what] = {"exit": int(rc), "seconds": float(secs)}
    if what.startswith("naive"):
        try:
            r[what].update(json.loads(open(os.path.join(w, f"{name}.{what}.json")).read().strip().splitlines()[-1]))
        except Exception as e:
            r[what]["error"] = open(os.path.join(w, f"{name}.{what}.err")).read()[-600:]
    else:
        try:
            r[what]["verdict"] = json.load(open(os.path.join(w, f"{name}.{what}.verdict.json")))
        except Exception as e:
            r[what]["verdict_error"] = open(os.path.join(w, f"{name}.{what}.out")).read()[-1500:]
        mem = [int(x) for x in open(os.path.join(w, f"{name}.{what}.mem.txt")).read().split() if x.isdigit()]
        r[what]["gpu_memory_peak_mib"] = max(mem) if mem else None
json.dump(list(rows.values()), open(out, "w"), indent=1, default=str)
if mode != "table":
    sys.exit(0)
print("%-20s %-12s %9s %9s %8s %7s %7s %8s  %s" % ("CANDIDATE", "RUN", "NAIVE-H s", "NAIVE-D s", "VERIFY s", "/ NH", "/ ND", "PEAK GiB", "VERDICT; PHASES s"))
for r in rows.values():
    nh, nd = r.get("naive-host", {}), r.get("naive-device", {})
    for what in ("verify", "verify-again", "verify-warm"):
        v = r.get(what)
        if not v:
            continue
        verdict = v.get("verdict", {})
        phases = " ".join(f"{k} {x:.1f}" for k, x in verdict.get("phase_seconds", {}).items())
        peak = v.get("gpu_memory_peak_mib")
        print("%-20s %-12s %9.1f %9.1f %8.1f %7.2f %7.2f %8s  %s %s; %s" % (
            r["name"], what, nh.get("seconds", float("nan")), nd.get("seconds", float("nan")), v["seconds"],
            v["seconds"] / nh.get("seconds", float("nan")), v["seconds"] / nd.get("seconds", float("nan")),
            "%.1f" % (peak / 1024) if peak else "-", verdict.get("outcome", "?"), verdict.get("rejected_by") or "", phases))
PY
}
START=$(date +%s)
SOCK=$W/kforge.sock
[ "${WARM_ONLY:-0}" = 1 ] && WARM=1
gpu_warm() {  # 0 when GPU 0's pool has an idle warm worker
  local st
  st=$(target/release/kforge --socket "$SOCK" status --json 2>/dev/null) || return 1
  python3 -c 'import json, sys; d = json.loads(sys.argv[1]); sys.exit(0 if any(x["name"] == "0" and x["pool"]["warm"] >= 1 for x in d["devices"]) else 1)' "$st"
}
if [ "${WARM:-0}" = 1 ]; then
  target/release/kforge --socket "$SOCK" daemon --warm-workers 1 --worker-fork \
    --worker-preload torch,triton,torch._dynamo,torch._inductor.compile_fx,kforge.verify.cascade,kforge.verify.checks,kforge.verify.kernel \
    >"$W/daemon.log" 2>&1 &
  DAEMON=$!
  trap 'target/release/kforge --socket "$SOCK" shutdown >/dev/null 2>&1; kill $DAEMON 2>/dev/null' EXIT
  # Without a warm worker the call goes on cold rather than end (WARM_ONLY=1: it ends).
  for _ in $(seq 240); do gpu_warm && break; sleep 0.5; done
  if ! gpu_warm; then
    echo "WARM=1: no warm worker on GPU 0 after 120 s: the warm verifies are left out"; tail -n 5 "$W/daemon.log"; WARM=0
    [ "${WARM_ONLY:-0}" = 1 ] && { echo "WARM_ONLY=1: nothing to run without a warm worker"; exit 1; }
  fi
fi
NAMES=()
declare -A POLICY=()
for arg in "$@"; do
  case $arg in
    eager:*)
      for f in ${arg#eager:}; do  # the glob, expanded here
        [ -f "$f" ] || { echo "no problem file $f"; continue; }
        name=eager-$(basename "$f" .py)
        [ -n "${SKIP:-}" ] && grep -qxF "$name" "$SKIP" && continue
        PROBLEM[$name]=$f POLICY[$name]=$W/$name/policy.toml NAMES+=("$name")  # made when its turn comes
      done ;;
    *) NAMES+=("$arg") ;;
  esac
done
for name in "${NAMES[@]}"; do
  prob=${PROBLEM[$name]:-}
  cand=tests/candidates/suite/$name.py
  [ -n "${POLICY[$name]:-}" ] && cand=$W/$name/model_new.py
  [ -n "$prob" ] && { [ -f "$cand" ] || [ -n "${POLICY[$name]:-}" ]; } || { echo "unknown candidate $name"; continue; }
  [ -n "${SKIP:-}" ] && grep -qxF "$name" "$SKIP" && continue
  [ $(( $(date +%s) - START )) -gt "${DEADLINE_S:-540}" ] && { echo "deadline: $name and the rest not started"; break; }
  if [ -n "${POLICY[$name]:-}" ] && [ ! -f "$cand" ]; then  # eager:GLOB: its eager result file, made now (a torch import each)
    PYTHONPATH=$PWD/python python3 -m kforge.optimize.result "$prob" --eager --out "$W/$name" >/dev/null \
      || { echo "$prob: no eager result file"; continue; }
  fi
  policy=(); [ -n "${POLICY[$name]:-}" ] && policy=(--policy "${POLICY[$name]}")
  for inputs in $( [ "${SKIP_NAIVE:-0}" = 1 ] || echo "${NAIVE_INPUTS:-host device}" ); do
    t0=$(now)
    python3 scripts/device/naive_harness.py "$prob" "$cand" --size large --inputs "$inputs" >"$W/$name.naive-$inputs.json" 2>"$W/$name.naive-$inputs.err"
    rc=$?
    echo "$name naive-$inputs $rc $(awk -v a="$(now)" -v b="$t0" "BEGIN{printf \"%.3f\", a-b}")" >>"$W/walls.txt"
  done
  runs="verify $( [ "${VERIFY_AGAIN:-0}" = 1 ] && echo verify-again ) $( [ "${WARM:-0}" = 1 ] && echo verify-warm )"
  [ "${WARM_ONLY:-0}" = 1 ] && runs=verify-warm
  for what in $runs; do
    ( while :; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.5; done ) >"$W/$name.$what.mem.txt" 2>/dev/null &
    sampler=$!
    how=(); [ "$what" = verify-warm ] && how=(--daemon --warm)
    t0=$(now)
    target/release/kforge --socket "$SOCK" verify "$prob" "$cand" --size large "${how[@]}" "${policy[@]}" --json "$W/$name.$what.verdict.json" >"$W/$name.$what.out" 2>&1
    rc=$?
    echo "$name $what $rc $(awk -v a="$(now)" -v b="$t0" "BEGIN{printf \"%.3f\", a-b}")" >>"$W/walls.txt"
    kill "$sampler" 2>/dev/null
    tail -n 3 "$W/$name.$what.out"
  done
  summarize quiet  # $OUT/verify_scale.json after every candidate: a call cut at its limit keeps them
  kept=verify; [ "${WARM_ONLY:-0}" = 1 ] && kept=verify-warm
  [ -f "$W/$name.$kept.verdict.json" ] && echo "$name" >>"$OUT/done.txt"
done
if [ -f "$W/daemon.log" ]; then  # WARM=1: the warm worker's start, its preloads and any it left out
  echo "== warm worker (daemon log):"
  grep -E "left out|starting again|ready on device|before it was ready|before becoming ready" "$W/daemon.log" | head -n 8
fi
summarize table
