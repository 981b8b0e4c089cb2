#!/usr/bin/env bash
# `kforge inspect` over the problem suite on the GPU machine (issue 6), one device call per slice.
# Builds nothing there: carry target/release/kforge.
#
#   bash scripts/device/inspect.sh MODE [GLOB] [LIMIT]
#     MODE   default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs
#     GLOB   problem files (default problems/level*/*.py), LIMIT: only the first LIMIT of them
#
# Per problem: $OUT/MODE/<name>.capture.json (the raw capture: wrappers, profile, replay,
# re-stitch — also the CI fixtures of crates/kforge-inductor) and <name>.report.json; a failure
# keeps its reason in <name>.err. Prints one table row per problem last and writes
# $OUT/MODE/summary.json.
set -uo pipefail
OUT=${OUT:-/tmp/kforge-out}
MODE=${1:?mode}
GLOB=${2:-problems/level*/*.py}
LIMIT=${3:-1000}
K=$PWD/target/release/kforge
test -x "$K" || { echo "carry target/release/kforge"; exit 2; }
D=$OUT/$MODE
mkdir -p "$D"
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_FX_GRAPH_CACHE=0
nvidia-smi -L
n=0
for f in $GLOB; do
  n=$((n + 1)); [ "$n" -le "$LIMIT" ] || break
  name=$(basename "$f" .py)
  t0=$(date +%s.%N)
  if "$K" inspect "$f" --mode "$MODE" --capture-out "$D/$name.capture.json" --json "$D/$name.report.json" >"$D/$name.txt" 2>"$D/$name.err"; then
    rm -f "$D/$name.err"
  fi
  echo "$name $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s"
done
python3 - "$D" <<'PY'
import glob, json, os, sys
d = sys.argv[1]
rows = []
for txt in sorted(glob.glob(f"{d}/*.txt")):
    name = os.path.basename(txt)[:-4]
    rep, err = f"{d}/{name}.report.json", f"{d}/{name}.err"
    if os.path.exists(rep):
        r = json.load(open(rep))
        rs = r.get("restitch") or {}
        rp = r.get("replay") or []
        rows.append({"problem": name, "ok": True, "graphs": r["graphs"], "triton": r["triton_kernels"], "templates": r["template_kernels"],
                     "vendor": r["vendor_calls"], "gpu_us": r["attribution"]["total_us"], "replaceable_share": r["attribution"]["replaceable_share"],
                     "unattributed_us": sum(u[1] for u in r["attribution"]["unattributed"]),
                     "replay_ok": f"{sum(1 for x in rp if x.get('ok'))}/{len(rp)}", "restitch_identical": rs.get("identical"),
                     "restitch_ratio": rs.get("ratio"), "eager_diff": (r.get("check") or {}).get("max_abs_diff_vs_eager")})
    else:
        lines = open(err).read().strip().splitlines() if os.path.exists(err) else ["no report"]
        cause = [l for l in lines if l.startswith("kforge capture:")] or lines[-1:] or ["?"]
        rows.append({"problem": name, "ok": False, "reason": cause[0][:160]})
json.dump(rows, open(f"{d}/summary.json", "w"), indent=1)
print(f"{'PROBLEM':<40} {'TRITON':>6} {'TEMPL':>5} {'VENDOR':>6} {'GPU_US':>9} {'REPL%':>6} {'REPLAY':>7} {'RESTITCH':>9} {'T/T0':>6}")
for r in rows:
    if r["ok"]:
        ratio = f"{r['restitch_ratio']:.3f}" if r["restitch_ratio"] else "-"
        print(f"{r['problem']:<40} {r['triton']:>6} {r['templates']:>5} {r['vendor']:>6} {r['gpu_us']:>9.1f} {r['replaceable_share']*100:>5.1f}% {r['replay_ok']:>7} {str(r['restitch_identical']):>9} {ratio:>6}")
    else:
        print(f"{r['problem']:<40} FAILED: {r['reason']}")
print(f"{sum(r['ok'] for r in rows)}/{len(rows)} problems inspected in mode {os.path.basename(d)}")
PY
