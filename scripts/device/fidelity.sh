#!/usr/bin/env bash
# Region fidelity of the DESIGN-NOTES §1 kernels (issue 3), interleaved and repeated, one device call.
# Builds nothing there: carry target/release/kforge and target/release/libkforge_shim.so.
#
# Each of ROUNDS rounds times the bf16 4096^3 matmul and the 256 MB x*2 with kforge.do_bench:
#   alone      the GPU idle (and cool) — the reference of this round;
#   region     next to 3 competing bf16 8192^3 matmul loops (started with `kforge run`) that have
#              run for HEAT_S seconds, under --policy region (gate, drain, freeze, settle, pin);
#   hot-alone  (HOT=1 only) alone again, timed the moment the competitors are gone: the GPU as
#              hot as in `region`, nothing else resident — separates heat from interference.
# Inflation is paired: each round's p95 over the same round's `alone`. Writes $OUT/fidelity.json,
# $OUT/clocks.csv (nvidia-smi every 50 ms) and prints a table last.
set -euo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
ROUNDS=${ROUNDS:-4}
HEAT_S=${HEAT_S:-3}
K=$PWD/target/release/kforge
test -x "$K" && test -f target/release/libkforge_shim.so || { echo "carry target/release/kforge and target/release/libkforge_shim.so"; exit 2; }
W=$(mktemp -d /tmp/kforge-fid.XXXXXX)
S=$W/k.sock
D=scripts/device
export PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$OUT/gpu.txt"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader,nounits -lms 50 >"$OUT/clocks.csv" 2>/dev/null &
SMI=$!
setsid "$K" --socket "$S" daemon --db "$OUT/fidelity.db" --reserve-cores 2 --warm-workers 0 >"$OUT/daemon.log" 2>&1 &
for _ in $(seq 200); do "$K" --socket "$S" status >/dev/null 2>&1 && break; sleep 0.05; done
"$K" --socket "$S" status | tee "$OUT/status.txt"

competitors() {  # start 3 competitors under policy $1, wait until all submit work
  rm -f "$W"/ready.*
  CPIDS=()
  for i in 1 2 3; do
    "$K" --socket "$S" run --device 0 --policy "$1" --label "competitor-$1" -- python3 $D/competitor.py "$W/ready.$i" >/dev/null 2>&1 &
    CPIDS+=($!)
  done
  for _ in $(seq 600); do [ "$(ls "$W"/ready.* 2>/dev/null | wc -l)" = 3 ] && break; sleep 0.1; done
}
stop_competitors() {
  kill "${CPIDS[@]}" 2>/dev/null || true   # a lost client cancels its job
  wait "${CPIDS[@]}" 2>/dev/null || true
  for _ in $(seq 400); do "$K" --socket "$S" status | grep -q "competitor" || break; sleep 0.05; done
}

for r in $(seq "$ROUNDS"); do
  echo "== round $r ($(date +%T))"
  "$K" --socket "$S" run --device 0 --label "alone-$r" -- python3 $D/timed_kernels.py "alone-$r" "$W/r$r-alone.json"
  competitors region
  sleep "$HEAT_S"
  "$K" --socket "$S" run --device 0 --policy region --label "region-$r" -- python3 $D/timed_kernels.py "region-$r" "$W/r$r-region.json"
  if [ -z "${HOT:-}" ]; then stop_competitors; continue; fi
  # hot-alone: set up next to the competitors (policy none: no region), start timing when they are gone.
  rm -f "$W/go" "$W/go.ready"
  KFORGE_TIMED_GO_FILE="$W/go" "$K" --socket "$S" run --device 0 --policy none --label "hot-alone-$r" -- python3 $D/timed_kernels.py "hot-alone-$r" "$W/r$r-hot.json" &
  HP=$!
  for _ in $(seq 600); do [ -e "$W/go.ready" ] && break; sleep 0.05; done
  stop_competitors
  touch "$W/go"
  wait $HP
done
kill $SMI 2>/dev/null || true
"$K" --socket "$S" report > "$OUT/report.json"
"$K" --socket "$S" shutdown || true
cp "$W"/r*.json "$OUT"/
python3 - "$OUT" "$ROUNDS" "${HOT:-}" <<'PY'
import datetime, json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
settings = ("alone", "region", "hot-alone") if sys.argv[3] else ("alone", "region")
kernels = ("matmul_bf16_4096", "elementwise_x2_256MB")
clocks = []
for line in open(f"{out}/clocks.csv"):
    p = [x.strip() for x in line.split(",")]
    try:
        t = datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        clocks.append((t, float(p[1]), float(p[2]), float(p[3]), float(p[4]), p[5]))
    except (ValueError, IndexError):
        continue
def env(d):
    w = [c for c in clocks if d["t_start"] <= c[0] <= d["t_end"]]
    if not w:
        return {}
    return {"sm_mhz": statistics.fmean(c[1] for c in w), "mem_mhz": statistics.fmean(c[2] for c in w),
            "power_w_max": max(c[3] for c in w), "temp_c": statistics.fmean(c[4] for c in w),
            "reasons": sorted({c[5] for c in w})}
res = {"rounds": [], "summary": {}}
for r in range(1, rounds + 1):
    row = {}
    for setting, f in (("alone", "alone"), ("region", "region"), ("hot-alone", "hot"))[: len(settings)]:
        d = json.load(open(f"{out}/r{r}-{f}.json"))
        row[setting] = {k: {"median_ms": d[k]["median_ms"], "p95_ms": d[k]["p95_ms"], **env(d[k])} for k in kernels}
    res["rounds"].append(row)
rep = json.load(open(f"{out}/report.json"))
res["regions"] = [r for r in rep["regions"] if r["name"].startswith("region-")]
print(f"{'ROUND':<6} {'SETTING':<10} {'KERNEL':<21} {'MED_MS':>8} {'P95_MS':>8} {'P95_INFL':>9} {'SM_MHZ':>7} {'TEMP_C':>6}")
for i, row in enumerate(res["rounds"], 1):
    for s in settings:
        for k in kernels:
            x = row[s][k]; base = row["alone"][k]["p95_ms"]
            x["p95_inflation"] = x["p95_ms"] / base - 1
            print(f"{i:<6} {s:<10} {k:<21} {x['median_ms']:>8.4f} {x['p95_ms']:>8.4f} {x['p95_inflation']*100:>8.2f}% {x.get('sm_mhz', 0):>7.0f} {x.get('temp_c', 0):>6.1f}")
print()
print(f"{'SETTING':<10} {'KERNEL':<21} {'P95_INFL median over rounds':>28} {'max':>8}   (paired with each round's alone)")
for s in settings[1:]:
    for k in kernels:
        v = [row[s][k]["p95_inflation"] for row in res["rounds"]]
        res["summary"].setdefault(s, {})[k] = {"p95_inflation_median": statistics.median(v), "p95_inflation_max": max(v), "per_round": v}
        print(f"{s:<10} {k:<21} {statistics.median(v)*100:>27.2f}% {max(v)*100:>7.2f}%")
a = [row["alone"][k]["p95_ms"] for row in res["rounds"] for k in kernels[:1]]
print(f"alone matmul p95 across rounds: {min(a):.4f}-{max(a):.4f} ms (spread {(max(a)/min(a)-1)*100:.2f}%)")
for r in res["regions"]:
    print(f"region {r['name']}: wait {r['wait_ms']:.0f} ms, drain {r['drain_ms']:.1f} ms, freeze {r['freeze_ms']:.2f} ms, settle {r.get('settle_ms', 0):.0f} ms, GPU {r.get('gpu_temp_c_granted')} C / {r.get('sm_clock_mhz_granted')} MHz at grant, tainted {r['tainted']}")
json.dump(res, open(f"{out}/fidelity.json", "w"), indent=1)
PY
