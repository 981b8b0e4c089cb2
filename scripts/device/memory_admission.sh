#!/usr/bin/env bash
# GPU-memory-aware admission on a real GPU, one device call; builds nothing there.
# Needs target/release/kforge (and libkforge_shim.so beside it) carried.
#   A daemon on GPU 0 with room for 8 jobs by count. Round 1: JOBS jobs at once, each holding GIB
#   GiB (together more than the GPU has), none declared: admission counts each with the default
#   share, so some start beside others and may run out of memory; those must be run again alone
#   and end well. Round 2: the same jobs again: the daemon now knows their peak from round 1.
#   Round 3: the same jobs declared with --gpu-memory. Every job must end with exit 0 in every round.
# Writes $OUT/memory.json and prints a table last.
set -uo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
K=$PWD/target/release/kforge
test -x "$K" || { echo "carry target/release/kforge"; exit 2; }
W=$(mktemp -d /tmp/kforge-mem.XXXXXX)
S=$W/k.sock
JOBS=${JOBS:-6}
GIB=${GIB:-45}
HOLD_S=${HOLD_S:-4}
ROUND_TIMEOUT_S=${ROUND_TIMEOUT_S:-120}
SCRIPT=$PWD/scripts/device/hold_memory.py
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
setsid "$K" --socket "$S" daemon --db "$W/mem.db" --max-concurrent 8 >"$W/daemon.log" 2>&1 &
# A failing round exits early: the daemon (and its warm workers' GPU memory) goes with the script.
trap '"$K" --socket "$S" shutdown >/dev/null 2>&1 || true' EXIT
for _ in $(seq 200); do "$K" --socket "$S" status >/dev/null 2>&1 && break; sleep 0.05; done
"$K" --socket "$S" status | head -12

round() { # NAME EXTRA_FLAGS... -> one line per job: name job rc seconds
  local name=$1; shift
  local s; s=$(date +%s.%N)
  # A round ends when each of its clients wrote its line: the daemon is a background job of this
  # shell too, so `wait` or `jobs -r` would wait for it as well (a round would never end).
  for i in $(seq "$JOBS"); do
    ( t=$(date +%s.%N)
      "$K" --socket "$S" run --device 0 --label "mem-$i" "$@" -- python3 "$SCRIPT" "$GIB" "$HOLD_S" \
        >"$W/$name-$i.out" 2>"$W/$name-$i.err"
      echo "$name $i $? $(python3 -c "import time; print(round(time.time()-$t, 2))")" >>"$W/rounds.txt" ) &
  done
  # A round that does not end in time is a failure of admission: show the daemon's view and stop.
  local deadline=$(( $(date +%s) + ROUND_TIMEOUT_S ))
  while [ "$(grep -c "^$name " "$W/rounds.txt")" -lt "$JOBS" ]; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "round $name did not end within ${ROUND_TIMEOUT_S} s; the daemon's status and log:"
      "$K" --socket "$S" status
      "$K" --socket "$S" status --json | python3 -c "import json,sys; d=json.load(sys.stdin); print(json.dumps([x.get('memory') for x in d['devices']])); print(json.dumps([[j.get('job'), j.get('state'), j.get('memory')] for j in d['jobs']]))"
      tail -n 40 "$W/daemon.log"
      tail -n 5 "$W"/*.err
      exit 3
    fi
    sleep 1
  done
  echo "$name wall $(python3 -c "import time; print(round(time.time()-$s, 2))")" >>"$W/walls.txt"
  "$K" --socket "$S" status | grep -E "memory:" | head -2
}
: >"$W/rounds.txt"; : >"$W/walls.txt"
round undeclared
round learned
round declared --gpu-memory "$GIB"
"$K" --socket "$S" report --json >"$W/report.json"
"$K" --socket "$S" shutdown >/dev/null 2>&1 || true
grep -h -i "out of memory\|job_retried\|kforge: job" "$W"/*.err | sort | uniq -c | head -10
python3 - "$W" "$OUT" "$JOBS" "$GIB" <<'PY'
import json, sys
w, out, jobs, gib = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
rows = [l.split() for l in open(f"{w}/rounds.txt") if l.strip()]
walls = {l.split()[0]: float(l.split()[2]) for l in open(f"{w}/walls.txt") if l.strip()}
rep = json.load(open(f"{w}/report.json"))
mem = {m["job"]: m for m in rep.get("job_memory", [])}
jobs_by_id = sorted(rep["jobs"], key=lambda j: j["id"])
summary = {"jobs_per_round": jobs, "gib_per_job": gib, "rounds": {}}
for name in ("undeclared", "learned", "declared"):
    mine = [r for r in rows if r[0] == name]
    summary["rounds"][name] = {"wall_s": walls.get(name), "exit_codes": sorted(int(r[2]) for r in mine)}
ids = [j["id"] for j in jobs_by_id]
for k, name in enumerate(("undeclared", "learned", "declared")):
    these = [mem[i] for i in ids[k * jobs:(k + 1) * jobs] if i in mem]
    summary["rounds"][name].update({
        "retried": sum(1 for m in these if m.get("retried")),
        "sources": sorted({m.get("source") for m in these}),
        "peak_gib_max": round(max((m.get("peak_bytes") or 0) for m in these) / 2**30, 2) if these else None,
    })
json.dump(summary, open(f"{out}/memory.json", "w"), indent=1)
print(f"{'ROUND':<11} {'WALL_S':>7} {'EXIT 0':>7} {'RETRIED':>8} {'SOURCE':<10} {'PEAK_GIB':>8}")
for name, r in summary["rounds"].items():
    ok = sum(1 for c in r["exit_codes"] if c == 0)
    print(f"{name:<11} {r['wall_s']:>7} {ok:>4}/{len(r['exit_codes']):<2} {r['retried']:>8} {','.join(map(str, r['sources'])):<10} {r['peak_gib_max']!s:>8}")
PY
