#!/usr/bin/env bash
# Issue 17 item 6: the inspect round trip's noise floor with jobs in flight, at both presets, in
# one device call (`scripts/analysis/floor_rounds.py` reads the rounds back from the stores).
#   1. large (LARGE=1, default): the three misses of bench/results/large-suite/ (the unrolled LSTM,
#      two bf16 GEMMs) with six eager verifies beside them, 4 in flight: $OUT/large/;
#   2. default: the suite's inspects in default mode at the default preset, 4 in flight, every
#      problem of problems/level$LEVELS (default *) that starts before DEFAULT_DEADLINE_S
#      (default 240) and is not in SKIP_DEFAULT (a done.txt of an earlier call): $OUT/default/;
#      DEFAULT_GLOBS names the problems instead (e.g. 'problems/level1/01[1-9]_*.py problems/level1/02*.py').
#   0. PROBE=1 first: scripts/device/host_jitter_probe.py (about 40 s, no daemon): launch-bound
#      calls' host time per cpu with its steal and irq ticks, $OUT/host_jitter_probe.json.
# REGION_CPUS (suite.sh) picks the region holders' cpus. Builds nothing: carry
# target/release/kforge and target/release/libkforge_shim.so.
set -u
OUT=${OUT:-/tmp/kforge-out}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${PROBE:-0}" = 1 ]; then
  mkdir -p "$OUT"
  timeout 120 python3 scripts/device/host_jitter_probe.py "$OUT/host_jitter_probe.json" 2>&1 | tail -12
fi
if [ "${LARGE:-1}" = 1 ]; then
  OUT=$OUT/large SIZE=large PARALLEL=4 INTERLEAVE=1 DEADLINE_S=${LARGE_DEADLINE_S:-150} bash scripts/device/suite.sh \
    "inspect:default:problems/level3/009_*.py" "inspect:default:problems/level2/010_*.py" \
    "inspect:default:problems/level2/002_*.py" "verify-eager:problems/level2/00[3-8]_*.py" 2>&1 | tail -16
fi
# DEFAULT_GLOBS (space-separated, Python's glob syntax, expanded by suite.py, not the shell):
# the default part's problems instead of problems/level$LEVELS/*.py.
read -ra GLOBS <<<"${DEFAULT_GLOBS:-problems/level${LEVELS:-*}/*.py}"
TASKS=()
for g in "${GLOBS[@]}"; do TASKS+=("inspect:default:$g"); done
OUT=$OUT/default SKIP=${SKIP_DEFAULT:-} SIZE=default PARALLEL=4 DEADLINE_S=${DEFAULT_DEADLINE_S:-240} \
  bash scripts/device/suite.sh "${TASKS[@]}" 2>&1 | tail -30
