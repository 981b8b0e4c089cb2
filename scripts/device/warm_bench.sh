#!/usr/bin/env bash
# Warm-worker benchmark (issue 4), one device call; builds nothing here.
# Needs target/release/kforge (and libkforge_shim.so beside it, if built) carried.
#   1. per-command end-to-end time of a trivial torch script, cold vs warm (sequential);
#   2. wall time of 200 such commands with 8 in flight, cold vs warm.
# Writes $OUT/warm.json and prints a short table last.
set -euo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
K=$PWD/target/release/kforge
W=$(mktemp -d /tmp/kforge-warm.XXXXXX)
S=$W/k.sock
SCRIPT=$PWD/scripts/device/trivial_torch.py
N=${N:-200}
setsid "$K" --socket "$S" daemon --db "$W/warm.db" --warm-workers 8 --max-concurrent 8 >"$W/daemon.log" 2>&1 &
for _ in $(seq 200); do "$K" --socket "$S" status >/dev/null 2>&1 && break; sleep 0.05; done
t0=$(date +%s.%N)
for _ in $(seq 1200); do "$K" --socket "$S" status --json | python3 -c "import json,sys; d=json.load(sys.stdin); sys.exit(0 if d['devices'][1]['pool']['warm']==8 else 1)" && break; sleep 0.1; done
t1=$(date +%s.%N)
echo "pool of 8 warm after $(python3 -c "print(round($t1-$t0,1))") s"
"$K" --socket "$S" status | grep -E "warm pool|gate shim"

one() { # MODE -> seconds for one command end to end
  local s e; s=$(date +%s.%N)
  if [ "$1" = warm ]; then "$K" --socket "$S" run --device 0 --warm -- python3 "$SCRIPT"; else "$K" --socket "$S" run --device 0 -- python3 "$SCRIPT"; fi
  e=$(date +%s.%N); python3 -c "print($e-$s)"
}
: >"$W/cold1.txt"; : >"$W/warm1.txt"
for i in 1 2 3 4 5; do one cold >>"$W/cold1.txt"; done
for i in $(seq 20); do one warm >>"$W/warm1.txt"; done

many() { # MODE -> wall seconds for N commands, 8 in flight
  local s e flag=""; [ "$1" = warm ] && flag="--warm"
  s=$(date +%s.%N)
  seq "$N" | xargs -P 8 -I{} "$K" --socket "$S" run --device 0 $flag -- python3 "$SCRIPT"
  e=$(date +%s.%N); python3 -c "print($e-$s)"
}
cold_many=$(many cold)
warm_many=$(many warm)
"$K" --socket "$S" status | grep -E "warm pool" || true
"$K" --socket "$S" shutdown || true
python3 - "$W" "$OUT" "$cold_many" "$warm_many" "$N" <<'PY'
import json, statistics, sys
w, out, cold_many, warm_many, n = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
cold = [float(x) for x in open(f"{w}/cold1.txt")]
warm = [float(x) for x in open(f"{w}/warm1.txt")]
res = {"cold_one_s": cold, "warm_one_s": warm, "cold_one_median_s": statistics.median(cold), "warm_one_median_s": statistics.median(warm),
       "commands": n, "in_flight": 8, "cold_many_wall_s": cold_many, "warm_many_wall_s": warm_many}
json.dump(res, open(f"{out}/warm.json", "w"), indent=1)
print(f"{'MEASURE':<44} {'COLD':>10} {'WARM':>10} {'RATIO':>7}")
print(f"{'one trivial torch command, median (s)':<44} {res['cold_one_median_s']:>10.3f} {res['warm_one_median_s']:>10.3f} {res['cold_one_median_s']/res['warm_one_median_s']:>6.1f}x")
print(f"{f'{n} commands, 8 in flight, wall (s)':<44} {cold_many:>10.1f} {warm_many:>10.1f} {cold_many/warm_many:>6.1f}x")
PY
