#!/usr/bin/env bash
# The device scripts' main paths in one call, after a change to the daemon, the binary or the
# Python package: each STAGE runs one script as it is, with its own output folder.
#
#   bash scripts/device/smoke.sh STAGE...
#   STAGE: sanity | warm | suite:TASK[,TASK...]   (suite tasks as scripts/device/suite.sh takes them)
#
# Needs target/release/kforge and target/release/libkforge_shim.so carried (built from this tree:
# suite.sh refuses a binary whose embedded Python differs). Writes $OUT/smoke.tgz (every stage's
# output), $OUT/smoke.json (stage, exit status, seconds) and prints the stages' tables, then a
# table of the stages last.
set -uo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
[ $# -gt 0 ] || { echo "usage: smoke.sh STAGE... (sanity | warm | suite:TASK[,TASK...])"; exit 2; }
test -x target/release/kforge || { echo "carry target/release/kforge"; exit 2; }
W=$(mktemp -d /tmp/kforge-smoke.XXXXXX)
rows=()
failed=0
for stage in "$@"; do
  name=${stage%%:*}
  dir=$W/$name
  mkdir -p "$dir"
  t0=$(date +%s%N)
  case $name in
    sanity) OUT=$dir SANITY_OUT=$dir bash scripts/device/sanity.sh >"$dir/stdout.txt" 2>&1 ;;
    warm) OUT=$dir bash scripts/device/warm_bench.sh >"$dir/stdout.txt" 2>&1 ;;
    suite) IFS=, read -r -a tasks <<<"${stage#suite:}"
           OUT=$dir bash scripts/device/suite.sh "${tasks[@]}" >"$dir/stdout.txt" 2>&1 ;;
    *) echo "unknown stage: $stage (sanity | warm | suite:TASK[,TASK...])" >"$dir/stdout.txt"; false ;;
  esac
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  secs=$((ms / 1000)).$(printf %03d $((ms % 1000)))
  [ "$rc" -eq 0 ] || failed=1
  rows+=("$name $rc $secs")
  echo "=== $stage: exit $rc after ${secs} s; its last lines:"
  tail -n 40 "$dir/stdout.txt"
done
tar -C "$W" -czf "$OUT/smoke.tgz" . 2>/dev/null
printf '%s\n' "${rows[@]}" | python3 -c '
import json, sys
rows = []
for line in sys.stdin:
    if line.strip():
        stage, rc, secs = line.split()
        rows.append({"stage": stage, "exit": int(rc), "seconds": float(secs)})
json.dump(rows, open(sys.argv[1], "w"), indent=1)
print("%-8s %4s %8s" % ("STAGE", "EXIT", "SECONDS"))
for r in rows:
    print("%-8s %4d %8.1f" % (r["stage"], r["exit"], r["seconds"]))
' "$OUT/smoke.json"
exit $failed
