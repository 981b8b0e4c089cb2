#!/usr/bin/env bash
# The dispatch agent's per-graph plans on a real GPU, one device call (2-4 min on an H200); builds
# nothing. A forward of two graphs (python/tests/fixtures/graphs/linear_hook_softmax.py, a
# torch.compiler.disable'd hook between them) through `python3 -m kforge.optimize.dispatch` with
# every mode, CUDA graphs included, and --graph-rounds 2: plans that mix CUDA-graph modes
# (max-autotune, reduce-overhead) on one graph with eager or no graphs on the other, which have run
# nowhere yet. Then the winner's result file is written and, with target/release/kforge carried,
# verified (`kforge verify PROBLEM model_new.py --policy policy.toml`, the whole cascade).
# Override: BASELINE (default max-autotune), ROUNDS (5), MODES, DEVICE (cuda; `DEVICE=cpu
#   MODES=eager,default BASELINE=default` checks the script on a machine without a GPU).
# $OUT gets dispatch.json, result/model_new.py, result/policy.toml, verdict.json, the logs and
# per_graph.txt (the table, printed last).
set -uo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT/result"
BASELINE=${BASELINE:-max-autotune}
ROUNDS=${ROUNDS:-5}
MODES=${MODES:-eager,default,max-autotune,max-autotune-no-cudagraphs,reduce-overhead}
DEVICE=${DEVICE:-cuda}
P=python/tests/fixtures/graphs/linear_hook_softmax.py
K=$PWD/target/release/kforge
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
python3 -m kforge.optimize.dispatch "$P" --out "$OUT/dispatch.json" --device "$DEVICE" --baseline "$BASELINE" \
  --modes "$MODES" --rounds "$ROUNDS" \
  --graph-rounds 2 2>"$OUT/dispatch.log"
echo "dispatch exit $?"
if [ -f "$OUT/dispatch.json" ]; then
  python3 -m kforge.optimize.result "$P" "$OUT/dispatch.json" --out "$OUT/result" 2>"$OUT/result.log"
  echo "result exit $?"
fi
if [ -x "$K" ] && [ -f "$OUT/result/model_new.py" ]; then
  "$K" verify "$P" "$OUT/result/model_new.py" --policy "$OUT/result/policy.toml" --json "$OUT/verdict.json" \
    $([ "$DEVICE" = cpu ] && echo "--device cpu --no-performance") \
    >"$OUT/verify.log" 2>&1
  echo "verify exit $?"
fi
python3 - "$OUT" <<'EOF' | tee "$OUT/per_graph.txt"
import json, os, sys
out = sys.argv[1]
try:
    r = json.load(open(os.path.join(out, "dispatch.json")))
except (OSError, ValueError) as e:
    print(f"no measurement: {e}; see dispatch.log")
    sys.exit(0)
g = r.get("graphs", {})
print(f"graphs {g.get('count')} breaks {g.get('breaks')}")
for i, rd in enumerate(g.get("rounds", [])):
    bad = {k: v.get("why") for k, v in rd.get("prepared", {}).items() if not v.get("ok")}
    print(f"round {i + 1} from {rd['from']}: moved to {rd.get('moved_to')}; left out {bad}")
    for k, v in sorted(rd.get("modes", {}).items(), key=lambda t: -t[1]["speedup"]):
        vs = rd.get("against_current", {}).get(k, {})
        print(f"  {k:<48} {v['speedup']:.3f}x vs baseline  {vs.get('speedup', 1.0):.3f}x vs current  beyond {vs.get('beyond_noise')}")
print(f"winner {r['winner']} (fallback {r['fallback']}), noise floor {r.get('noise_floor')}")
try:
    v = json.load(open(os.path.join(out, "verdict.json")))
    print(f"verify: {v.get('outcome')} {v.get('rejected_by') or ''}")
except (OSError, ValueError):
    print("verify: not run (carry target/release/kforge) or no verdict: see verify.log")
EOF
