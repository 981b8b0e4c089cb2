#!/usr/bin/env bash
# GPU sanity run of the region runtime (issue 2), one device call:
#   1. a daemon managing the GPU (cgroup v2 freezer, 2 reserved cores), `kforge status`;
#   2. the DESIGN-NOTES §1 kernels timed with kforge.do_bench under the daemon, alone;
#   3. the same next to 3 competing matmul processes started with `kforge run`, --policy none;
#   4. the same with --policy region (competitors frozen; no drain yet: the gate shim is issue 3).
# Needs target/release/kforge carried. Writes JSON under $OUT and prints a table last.
set -euo pipefail
OUT=${SANITY_OUT:-${OUT:-/tmp/kforge-out}}
mkdir -p "$OUT"
K=$PWD/target/release/kforge
W=$(mktemp -d /tmp/kforge-sanity.XXXXXX)
S=$W/k.sock
export PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$OUT/gpu.txt"
# GPU clocks, power and temperature every 50 ms, to tell interference from throttling.
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader,nounits -lms 50 >"$OUT/clocks.csv" 2>/dev/null &
SMI=$!
# No warm workers: their start-up (CUDA contexts) would disturb the "alone" baseline.
setsid "$K" --socket "$S" daemon --db "$OUT/sanity.db" --reserve-cores 2 --warm-workers 0 >"$OUT/daemon.log" 2>&1 &
for _ in $(seq 200); do "$K" --socket "$S" status >/dev/null 2>&1 && break; sleep 0.05; done
"$K" --socket "$S" status | tee "$OUT/status.txt"
run() { "$K" --socket "$S" run --device 0 "$@"; }

run --label alone -- python3 scripts/device/timed_kernels.py alone "$OUT/alone.json"

for policy in none region; do
  rm -f "$W"/ready.*
  pids=()
  for i in 1 2 3; do
    # Started directly (not through the shell function) so that $! is the kforge client.
    "$K" --socket "$S" run --device 0 --policy "$policy" --label "competitor-$policy" -- python3 scripts/device/competitor.py "$W/ready.$i" >/dev/null 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 600); do [ "$(ls "$W"/ready.* 2>/dev/null | wc -l)" = 3 ] && break; sleep 0.1; done
  run --policy "$policy" --label "timed-$policy" -- python3 scripts/device/timed_kernels.py "3-competitors-$policy" "$OUT/competing-$policy.json"
  kill "${pids[@]}" 2>/dev/null || true   # a lost client cancels its job
  wait "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 200); do "$K" --socket "$S" status | grep -q "^ *[0-9].*competitor" || break; sleep 0.05; done
done

kill $SMI 2>/dev/null || true
"$K" --socket "$S" report > "$OUT/report.json"
"$K" --socket "$S" shutdown || true
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
rows = [("alone", "alone.json"), ("3 competing, policy none", "competing-none.json"), ("3 competing, policy region", "competing-region.json")]
base = json.load(open(f"{out}/alone.json"))
summary = {}
print(f"{'SETTING':<30} {'KERNEL':<22} {'MEDIAN_MS':>10} {'P95_MS':>10} {'P95_INFL':>9}")
for label, f in rows:
    d = json.load(open(f"{out}/{f}"))
    for k in ("matmul_bf16_4096", "elementwise_x2_256MB"):
        infl = d[k]["p95_ms"] / base[k]["p95_ms"] - 1
        summary.setdefault(label, {})[k] = {"median_ms": d[k]["median_ms"], "p95_ms": d[k]["p95_ms"], "p95_inflation": infl}
        print(f"{label:<30} {k:<22} {d[k]['median_ms']:>10.4f} {d[k]['p95_ms']:>10.4f} {infl*100:>8.1f}%")
rep = json.load(open(f"{out}/report.json"))
regs = [r for r in rep["regions"] if r["name"].startswith("3-competitors-region")]
for r in regs:
    print(f"region {r['id']} {r['name']}: wait {r['wait_ms']:.2f} ms, drain {r['drain_ms']:.2f} ms, freeze {r['freeze_ms']:.2f} ms ({r['frozen_jobs']} jobs), settle {r.get('settle_ms', 0):.1f} ms (timed out: {r.get('settle_timed_out')}), core {r['core']}, tainted {r['tainted']}, GPU at grant {r.get('gpu_temp_c_granted')} C / {r.get('sm_clock_mhz_granted')} MHz, at release {r.get('gpu_temp_c_released')} C / {r.get('sm_clock_mhz_released')} MHz")
import datetime
clocks = []
for line in open(f"{out}/clocks.csv"):
    parts = [p.strip() for p in line.split(",")]
    try:
        t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        clocks.append((t, float(parts[1]), float(parts[2]), float(parts[3]), parts[4]))
    except (ValueError, IndexError):
        continue
for label, f in rows:
    d = json.load(open(f"{out}/{f}"))
    for k in ("matmul_bf16_4096", "elementwise_x2_256MB"):
        w = [c for c in clocks if d[k]["t_start"] <= c[0] <= d[k]["t_end"]]
        if w:
            sm = sum(c[1] for c in w) / len(w)
            summary[label][k].update({"sm_clock_mhz_mean": sm, "power_w_max": max(c[2] for c in w), "temp_c_max": max(c[3] for c in w), "clock_event_reasons": sorted({c[4] for c in w})})
            print(f"{label:<30} {k:<22} SM {sm:.0f} MHz, power max {max(c[2] for c in w):.0f} W, temp max {max(c[3] for c in w):.0f} C, reasons {sorted({c[4] for c in w})}")
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
PY
