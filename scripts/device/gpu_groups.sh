#!/usr/bin/env bash
# GPU groups on a machine of several GPUs, through a real daemon: every job of a group runs on one
# GPU, the groups spread over the GPUs by load, a refused submit binds nothing, and `status`
# counts the groups bound per GPU. Carry target/release/kforge and libkforge_shim.so.
#
#   bash scripts/device/gpu_groups.sh [GROUPS] [JOBS_PER_GROUP]     (default 8 groups × 4 jobs)
#
# Writes $OUT/gpu-groups.json; prints a table last; exits 1 when a group ran on two GPUs.
set -euo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
K=$PWD/target/release/kforge
groups=${1:-8}
per=${2:-4}
d=$(mktemp -d /tmp/kforge-groups.XXXXXX)
sock=$d/k.sock
"$K" --socket "$sock" daemon --db "$d/k.db" --max-concurrent 2 --warm-workers 0 > "$d/daemon.log" 2>&1 &
dpid=$!
trap 'kill "$dpid" 2>/dev/null || true; wait "$dpid" 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do "$K" --socket "$sock" status > /dev/null 2>&1 && break; sleep 0.1; done
"$K" --socket "$sock" status > /dev/null || { echo "daemon did not start:"; cat "$d/daemon.log"; exit 2; }
# Every job of every group at once: the first job of each group is placed by load.
pids=()
for g in $(seq 1 "$groups"); do
  for j in $(seq 1 "$per"); do
    "$K" --socket "$sock" run --gpu-group "g$g" -- sh -c 'echo "$KFORGE_DEVICE"; sleep 0.3' > "$d/g$g-$j.out" 2> "$d/g$g-$j.err" &
    pids+=("$!")
  done
done
for p in "${pids[@]}"; do wait "$p" || true; done
# A refused submit (no such device) binds nothing.
"$K" --socket "$sock" run --device 99 --gpu-group refused -- true > /dev/null 2>&1 && { echo "device 99 accepted?"; exit 2; }
"$K" --socket "$sock" status --json > "$d/status.json"
python3 - "$d" "$groups" "$per" "$OUT/gpu-groups.json" <<'EOF'
import json, sys
from collections import Counter
d, groups, per, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
placed = {f"g{g}": [open(f"{d}/g{g}-{j}.out").read().strip() for j in range(1, per + 1)] for g in range(1, groups + 1)}
status = json.load(open(f"{d}/status.json"))
bound = {x["name"]: x.get("gpu_groups", 0) for x in status["devices"]}
gpus = [x["name"] for x in status["devices"] if x["kind"] == "gpu"]
split = {g: sorted(set(v)) for g, v in placed.items() if len(set(v)) != 1}
per_device = Counter(v[0] for v in placed.values())
res = {"gpus": gpus, "groups": groups, "jobs_per_group": per, "placed": placed, "groups_per_device": per_device,
       "bound_per_device": bound, "split_groups": split, "ok": not split and sum(bound.values()) == (groups if gpus else 0)}
json.dump(res, open(out, "w"), indent=1)
print(f"{'DEVICE':<8} {'GROUPS PLACED':>14} {'BOUND (status)':>15}")
for dev in sorted(set(per_device) | set(bound)):
    print(f"{dev:<8} {per_device.get(dev, 0):>14} {bound.get(dev, 0):>15}")
print(f"{groups} groups x {per} jobs on {len(gpus)} GPU(s): " + ("every group on one device" if not split else f"SPLIT: {split}"))
sys.exit(0 if res["ok"] else 1)
EOF
