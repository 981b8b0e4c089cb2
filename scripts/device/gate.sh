#!/usr/bin/env bash
# Device validation of the gate shim (issue 3), one device call; builds nothing here.
# Needs target/release/kforge and target/release/libkforge_shim.so carried.
#   1. coverage: shim launch counts vs torch.profiler, outputs with and without the shim;
#   2. overhead: 100k tiny kernels with the shim (gate open) vs without, alternated 3 times;
#   3. fidelity: scripts/device/sanity.sh (§1 kernels alone / 3 competitors none / region).
# Writes $OUT/gate.json (+ fidelity report) and prints a short table last.
set -euo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
K=$PWD/target/release/kforge
SHIM=$PWD/target/release/libkforge_shim.so
test -x "$K" && test -f "$SHIM" || { echo "carry target/release/kforge and target/release/libkforge_shim.so"; exit 2; }
W=$(mktemp -d /tmp/kforge-gate.XXXXXX)
export PYTHONUNBUFFERED=1
D=scripts/device

echo "== driver API signatures the shim declares from memory (checked against this machine's cuda.h)"
H=$(ls /usr/local/cuda*/include/cuda.h 2>/dev/null | head -1 || true)
[ -n "$H" ] && grep -n -A4 -E "CUresult CUDAAPI (cuMemPrefetchAsync_v2|cuMemcpyBatchAsync|cuMemcpy3DBatchAsync)" "$H" > "$W/cuda_h_signatures.txt" || true
cat "$W/cuda_h_signatures.txt" 2>/dev/null | head -40 || true

echo "== coverage"
[ -n "${SKIP_COVERAGE:-}" ] || for mode in eager cublas triton compile-default compile-reduce-overhead; do
  python3 $D/shim_coverage.py $mode "$W/cov-$mode-plain"
  LD_PRELOAD=$SHIM KFORGE_SHIM_STATS="$W/cov-$mode-stats.json" python3 $D/shim_coverage.py $mode "$W/cov-$mode-shim"
done

echo "== overhead"
S=$W/k.sock
setsid "$K" --socket "$S" daemon --db "$W/ovh.db" --shim "$SHIM" >"$W/daemon-ovh.log" 2>&1 &
for _ in $(seq 200); do "$K" --socket "$S" status >/dev/null 2>&1 && break; sleep 0.05; done
"$K" --socket "$S" status | grep -E "gate shim|freeze"
for i in $(seq "${OVH_ROUNDS:-3}"); do
  "$K" --socket "$S" run --device 0 -- python3 $D/shim_overhead.py "${OVH_N:-100000}" "$W/ovh-shim-$i.json"
  "$K" --socket "$S" run --device 0 -- env -u LD_PRELOAD python3 $D/shim_overhead.py "${OVH_N:-100000}" "$W/ovh-plain-$i.json"
done
"$K" --socket "$S" shutdown || true

echo "== fidelity"
SANITY_OUT=$W/fidelity bash $D/sanity.sh | tail -12
cp "$W/fidelity/summary.json" "$OUT/fidelity-summary.json"
cp "$W/fidelity/report.json" "$OUT/fidelity-report.json"
cp "$W/fidelity/daemon.log" "$OUT/fidelity-daemon.log"
cp "$W/cuda_h_signatures.txt" "$OUT/" 2>/dev/null || true
cp "$W/fidelity/clocks.csv" "$OUT/fidelity-clocks.csv" 2>/dev/null || true

python3 - "$W" "$OUT" <<'PY'
import glob, json, os, statistics, sys
w, out = sys.argv[1], sys.argv[2]
res = {"coverage": {}, "overhead": {}, "fidelity": json.load(open(f"{w}/fidelity/summary.json"))}
print()
print(f"{'MODE':<26} {'PROFILER_API':>12} {'SHIM':>6} {'GPU_KERNELS':>11} {'SAME_OUTPUT':>11}")
for mode in ([] if os.environ.get("SKIP_COVERAGE") else ["eager", "cublas", "triton", "compile-default", "compile-reduce-overhead"]):
    p = json.load(open(f"{w}/cov-{mode}-plain.json"))
    s = json.load(open(f"{w}/cov-{mode}-shim.json"))
    stats = json.load(open(f"{w}/cov-{mode}-stats.json"))
    same = p["output_sha256"] == s["output_sha256"]
    res["coverage"][mode] = {"profiler_launch_api_calls": s["profiler_launch_api_calls"], "shim_launches": s["shim_launches"], "gpu_kernels": s["profiler_gpu_kernels"], "bit_identical": same, "shim_stats": stats}
    print(f"{mode:<26} {s['profiler_launch_api_calls']:>12} {s['shim_launches']:>6} {s['profiler_gpu_kernels']:>11} {str(same):>11}")
shim = [json.load(open(f))["us_per_launch"] for f in sorted(glob.glob(f"{w}/ovh-shim-*.json"))]
plain = [json.load(open(f))["us_per_launch"] for f in sorted(glob.glob(f"{w}/ovh-plain-*.json"))]
ms, mp = statistics.median(shim), statistics.median(plain)
res["overhead"] = {"us_per_launch_shim": shim, "us_per_launch_plain": plain, "median_slowdown": ms / mp - 1}
print(f"\noverhead: {len(shim)}+{len(plain)} alternated runs of {json.load(open(glob.glob(f'{w}/ovh-shim-*.json')[0]))['n']} launches: median {mp:.3f} us/launch without shim, {ms:.3f} with (gate open): {100*(ms/mp-1):+.2f}%; min {min(plain):.3f} vs {min(shim):.3f}")
print(f"\n{'FIDELITY':<30} {'KERNEL':<22} {'MEDIAN_MS':>10} {'P95_MS':>10} {'P95_INFL':>9}")
for setting, ks in res["fidelity"].items():
    for k, v in ks.items():
        print(f"{setting:<30} {k:<22} {v['median_ms']:>10.4f} {v['p95_ms']:>10.4f} {100*v['p95_inflation']:>8.1f}%")
json.dump(res, open(f"{out}/gate.json", "w"), indent=1)
PY
