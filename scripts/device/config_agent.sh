#!/usr/bin/env bash
# The config agent (issue 18) on a real GPU, one device call (< 10 min on an H200); builds nothing.
#   A few suite problems through `python3 -m kforge.optimize.config` (per Triton kernel of the
#   compiled baseline a launch-configuration search on its captured arguments, the winners pinned
#   through Inductor's autotune_lookup_table, re-stitched, timed end to end; the ModelNew file
#   written and checked on the device), no daemon (regions are no-ops: nothing else on the GPU).
#   With VERIFY=1 and target/release/kforge carried, every winner's model_new.py also goes through
#   `kforge verify PROBLEM model_new.py --policy policy.toml` (the whole cascade, gate 4 included;
#   minutes per problem: fewer problems per call then).
# Override: PROBLEMS="level1/009_layernorm_fp32:default ..." (problem:baseline), ROUNDS, MAX_CONFIGS,
#   TOP_KERNELS, PER_PROBLEM_S (each problem's time limit, default 180 s; a max-autotune problem
#   compiles three times: the baseline, the re-stitch with CUDA graphs, the result file's check).
#   A problem is not started after BUDGET_S (default 420 s) of the call. SIZE (default `default`)
#   is the problems' preset; EXTRA goes to every config step as it is (e.g. `--roof-skip 2`: every
#   kernel searched whatever its roofline, to see what the 95 % rule would have left out; the
#   roofline table, scripts/analysis/roofline_table.py, is printed after the agent's).
# $OUT gets, per problem, NAME.json (the agent's result), NAME/model_new.py, NAME/policy.toml,
#   NAME.log (stderr) and, when verified, NAME.verdict.json; config_agent.txt is the table, printed last.
set -uo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
PROBLEMS=${PROBLEMS:-"level1/009_layernorm_fp32:max-autotune level1/013_softmax_fp32:default level2/006_layernorm_gelu_residual_fp32:default"}
ROUNDS=${ROUNDS:-5}
MAX_CONFIGS=${MAX_CONFIGS:-24}
TOP_KERNELS=${TOP_KERNELS:-4}
PER_PROBLEM_S=${PER_PROBLEM_S:-180}
BUDGET_S=${BUDGET_S:-420}
VERIFY=${VERIFY:-0}
SIZE=${SIZE:-default}
read -ra EXTRA_ARGS <<<"${EXTRA:-}"
K=$PWD/target/release/kforge
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi -L | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee "$OUT/versions.txt"

for item in $PROBLEMS; do
  if [ "$SECONDS" -gt "$BUDGET_S" ]; then echo "budget: $item not started"; continue; fi
  p=${item%%:*}
  base=${item#*:}
  name=$(basename "$p")_$base
  echo "== $p against $base ($(date +%T))"
  timeout "$PER_PROBLEM_S" python3 -m kforge.optimize.config "problems/$p.py" --out "$OUT/$name.json" \
    --baseline "$base" --rounds "$ROUNDS" --max-configs "$MAX_CONFIGS" --top-kernels "$TOP_KERNELS" \
    --size "$SIZE" --result-dir "$OUT/$name" "${EXTRA_ARGS[@]}" 2>"$OUT/$name.log"
  echo "exit $?" | tee -a "$OUT/$name.log"
  if [ "$VERIFY" = 1 ] && [ -x "$K" ] && [ -f "$OUT/$name.json" ] && python3 -c "import json,sys; sys.exit(0 if json.load(open('$OUT/$name.json'))['winner'] == 'config' else 1)"; then
    timeout 240 "$K" verify "problems/$p.py" "$OUT/$name/model_new.py" --policy "$OUT/$name/policy.toml" \
      --json "$OUT/$name.verdict.json" >"$OUT/$name.verify.txt" 2>&1
    echo "verify exit $?" | tee -a "$OUT/$name.log"
  fi
done

python3 - "$OUT" <<'EOF' | tee "$OUT/config_agent.txt"
import glob, json, os, sys
out = sys.argv[1]
print(f"{'problem':<44} {'base':<13} {'triton':>6} {'tuned':>5} {'won':>3} {'model x':>8} {'ci95':<15} {'floor':>6} {'file':<10} verdict")
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    name = os.path.basename(path)[:-5]
    if name.endswith(".verdict"):
        continue
    try:
        r = json.load(open(path))
    except ValueError:
        continue
    if "agent" not in r:
        continue
    ks = r.get("kernels", {})
    won = sum(1 for k in ks.values() if k.get("fallback") is False)
    m = r.get("modes", {}).get("config", {})
    ci = m.get("ci95") or [None, None]
    mn = r.get("model_new", {})
    file = "n/a" if not mn else ("ok" if mn.get("ok") and not mn.get("missed") and not mn.get("not_found") else "MISSED")
    vpath = os.path.join(out, name + ".verdict.json")
    verdict = json.load(open(vpath)).get("outcome", "?") if os.path.exists(vpath) else "-"
    fmt = lambda x, f: (f % x) if isinstance(x, (int, float)) else "-"
    print(f"{name:<44} {r.get('baseline', ''):<13} {fmt(r.get('triton_share'), '%.2f'):>6} {len(ks):>5} {won:>3} "
          f"{fmt(m.get('speedup'), '%.3f'):>8} {fmt(ci[0], '%.3f') + '-' + fmt(ci[1], '%.3f'):<15} "
          f"{fmt(r.get('noise_floor'), '%.3f'):>6} {file:<10} {verdict}")
    for kname, k in ks.items():
        print(f"    {kname[:60]:<60} share {fmt(k.get('share'), '%.2f')} {k.get('kind', '?'):<20} "
              f"x{fmt(k.get('speedup'), '%.3f')} {'WIN ' + k.get('winner', '') if k.get('fallback') is False else k.get('error', 'kept')}"
              f" (tried {k.get('configs_tried', '-')}, excluded {len(k.get('excluded', {}))})")
EOF
python3 scripts/analysis/roofline_table.py $(grep -l '"agent": "config"' "$OUT"/*.json 2>/dev/null) \
  --json "$OUT/roofline.json" 2>&1 | tee "$OUT/roofline.txt"
# A device call brings back at most 8 files: the table stays, everything else goes into one archive.
(cd "$OUT" && tar -czf /tmp/config_agent.tgz --exclude=config_agent.txt --exclude=roofline.txt --exclude=roofline.json .) &&
  find "$OUT" -mindepth 1 ! -name config_agent.txt ! -name roofline.txt ! -name roofline.json -delete && mv /tmp/config_agent.tgz "$OUT/"
