#!/usr/bin/env bash
# `kforge profile` on the H200: Nsight Compute over a few suite problems' compiled forwards
# (default and max-autotune), directly and as a job of a daemon (the profiled forwards are a
# region), and a saved CSV read back with --from-csv. Validates the raw-page CSV layout
# that crates/kforge-ncu reads, the NVTX range filter and the kernel-name matching against ncu
# as installed there.
#
#   bash scripts/device/profile.sh
#
# Writes $OUT/profile.json (per problem and mode: exit status, kernels, tiers, seconds, the
# error's last lines) and $OUT/ncu-sample.csv (the first CSV, for the parser's fixtures), and
# prints a table last. Builds nothing: carry target/release/kforge and libkforge_shim.so.
#
# A dry run on the CPU, ncu stood in for by tests/ncu/fake-ncu (no program runs):
#   RESERVE=0 KFORGE=target/debug/kforge KFORGE_NCU=$PWD/tests/ncu/fake-ncu \
#     FAKE_NCU_LOG=$PWD/crates/kforge-ncu/tests/data/raw.csv FAKE_NCU_PEAK=4e12 bash scripts/device/profile.sh
set -uo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
K=$PWD/${KFORGE:-target/release/kforge}
test -x "$K" || { echo "carry target/release/kforge"; exit 2; }
# Runs: PROBLEM:MODE:HOW (HOW: direct, or daemon for a job of the daemon), each bounded by
# --timeout-s $LIMIT so that one device call (10 min) holds them all.
RUNS=${RUNS:-problems/level1/016_silu_bf16.py:default:direct problems/level1/016_silu_bf16.py:default:daemon problems/level1/014_log_softmax_vocab_bf16.py:max-autotune:direct problems/level3/001_mlp_block_fp32.py:default:direct}
LIMIT=${LIMIT:-120}
W=$(mktemp -d /tmp/kforge-profile.XXXXXX)
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$W/inductor-cache
("${KFORGE_NCU:-ncu}" --version 2>&1 | tail -1) >"$W/ncu-version.txt"
S=$W/k.sock
setsid "$K" --socket "$S" daemon --db "$W/store.db" --reserve-cores "${RESERVE:-2}" --freeze node >"$W/daemon.log" 2>&1 &
for _ in $(seq 200); do "$K" --socket "$S" status >/dev/null 2>&1 && break; sleep 0.05; done
if ! diff -rq --exclude=__pycache__ python/kforge "$S.d/python/kforge" >/dev/null; then
  echo "$K embeds another python/kforge than this tree: rebuild and carry it"
  "$K" --socket "$S" shutdown >/dev/null 2>&1; exit 2
fi
n=0
for run in $RUNS; do
  IFS=: read -r p mode how <<<"$run"
  n=$((n + 1))
  flag=(); [ "$how" = daemon ] && flag=(--daemon)
  t0=$(date +%s.%N)
  "$K" --socket "$S" profile "$p" --mode "$mode" --timeout-s "$LIMIT" "${flag[@]}" --json "$W/$n.json" --csv-out "$W/$n.csv" >"$W/$n.table" 2>"$W/$n.err"
  rc=$?
  t1=$(date +%s.%N)
  echo "$n $p $mode $how $rc $(awk "BEGIN{print $t1 - $t0}")" >>"$W/runs.txt"
done
if [ -f "$W/1.csv" ]; then
  head -c 200000 "$W/1.csv" >"$OUT/ncu-sample.csv"
  "$K" profile "$W/1.csv" --from-csv >"$W/from-csv.table" 2>&1
  echo "from-csv exit $?" >>"$W/runs.txt"
else
  echo "from-csv exit -1" >>"$W/runs.txt"
fi
"$K" --socket "$S" shutdown >/dev/null 2>&1 || true
python3 - "$W" >"$OUT/table.txt" <<'PY'
import json, sys
from pathlib import Path
w = Path(sys.argv[1])
def tier(m, c):
    if m is None or c is None: return "unknown"
    if m > 80 or c > 80: return "near-optimal"
    if m < 40 and c < 40: return "under-utilized"
    return "memory-bound" if m >= c else "compute-bound"
runs = []
for line in (w / "runs.txt").read_text().splitlines():
    parts = line.split()
    if parts[0] == "from-csv":
        runs.append({"from_csv_exit": int(parts[-1])}); continue
    n, p, mode, how, rc, s = parts
    r = {"problem": p, "mode": mode, "how": how, "exit": int(rc), "seconds": float(s)}
    j = w / f"{n}.json"
    if j.exists():
        ks = json.loads(j.read_text())["kernels"]
        doc = json.loads(j.read_text())
        r["metrics"], r["peaks"] = len(doc.get("metrics", [])), doc.get("peaks")
        r["kernels"] = [{"name": k["name"][:80], "launches": k["launches"], "us": k["time_ns"] / 1e3,
                         "mem": k["sol_memory_pct"], "sm": k["sol_compute_pct"], "occ": k["occupancy_pct"],
                         "dram_bytes": k.get("dram_bytes"), "flops": k.get("flops"),
                         "tier": tier(k["sol_memory_pct"], k["sol_compute_pct"])} for k in ks]
    else:
        r["error"] = (w / f"{n}.err").read_text(errors="replace")[-600:]
    runs.append(r)
out = {"ncu": (w / "ncu-version.txt").read_text().strip(), "runs": runs}
Path(sys.argv[1], "profile.json").write_text(json.dumps(out, indent=1))
print(f"ncu: {out['ncu']}")
print(f"{'problem':<44} {'mode':<13} {'how':<7} exit {'s':>6}  kernels  tiers")
for r in runs:
    if "problem" not in r:
        print(f"--from-csv of the first CSV: exit {r['from_csv_exit']}"); continue
    tiers = ",".join(sorted({k["tier"] for k in r.get("kernels", [])})) or r.get("error", "")[-80:].replace("\n", " ")
    print(f"{r['problem']:<44} {r['mode']:<13} {r['how']:<7} {r['exit']:>4} {r['seconds']:>6.1f}  {len(r.get('kernels', [])):>7}  {tiers}")
PY
cp "$W/profile.json" "$OUT/" 2>/dev/null
cat "$OUT/table.txt"
