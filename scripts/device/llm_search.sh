#!/usr/bin/env bash
# Issue 19's H200 run: the LLM agents' search over two suite problems through one daemon, the
# scripted endpoint serving the kernels (tests/llm/h200/script.json: honest, wrong and cheating
# ones), both problems in flight at once and several executors each, every candidate verified
# by `kforge verify --daemon` (gate 4 inside regions). Then the same run replayed from the
# journal with the endpoint gone (zero tokens, the same candidates).
#
#   bash scripts/device/llm_search.sh
#
# Writes $OUT/llm_search.json (every candidate: expected vs verdict, speedup, the calls' cost,
# the replay's agreement) and prints a table last. Builds nothing: carry target/release/kforge
# and target/release/libkforge_shim.so.
#
# The same run on the CPU (a dry run of this script, no GPU):
#   KFORGE=target/debug/kforge RESERVE=0 LLM_DIR=tests/llm/vector_add PROBLEMS=tests/candidates/problems/vector_add.py \
#     bash scripts/device/llm_search.sh
set -uo pipefail
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
K=$PWD/${KFORGE:-target/release/kforge}
LLM_DIR=${LLM_DIR:-tests/llm/h200}
PROBLEMS=${PROBLEMS:-problems/level1/016_silu_bf16.py problems/level1/014_log_softmax_vocab_bf16.py}
test -x "$K" || { echo "carry target/release/kforge"; exit 2; }
W=$(mktemp -d /tmp/kforge-llm.XXXXXX)
S=$W/k.sock
mkdir -p "$W/problems/level1"
for p in $PROBLEMS; do
  cp "$p" "$W/problems/level1/"
  [ -f "${p%.py}.toml" ] && cp "${p%.py}.toml" "$W/problems/level1/"
done
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$W/inductor-cache
nvidia-smi -L 2>/dev/null || echo "no nvidia-smi: a dry run on the CPU"
setsid "$K" --socket "$S" daemon --db "$W/store.db" --reserve-cores "${RESERVE:-2}" --freeze node --max-concurrent 8 >"$W/daemon.log" 2>&1 &
for _ in $(seq 200); do "$K" --socket "$S" status >/dev/null 2>&1 && break; sleep 0.05; done
if ! diff -rq --exclude=__pycache__ python/kforge "$S.d/python/kforge" >/dev/null; then
  echo "target/release/kforge embeds another python/kforge than this tree: rebuild and carry it"
  "$K" --socket "$S" shutdown >/dev/null 2>&1; exit 2
fi
"$K" scripted-endpoint "$LLM_DIR/script.json" --ready "$W/url" --log "$W/requests.jsonl" >/dev/null 2>"$W/endpoint.log" &
EP=$!
for _ in $(seq 200); do [ -s "$W/url" ] && break; sleep 0.05; done
URL=$(cat "$W/url")
FLAGS=(--baseline default --agents llm --model scripted --llm-iterations 1 --llm-chains 1 --llm-plans 3
       --llm-retries 2 --llm-executors 4 --jobs 2 --daemon --out "$W/out")
t0=$(date +%s)
"$K" --socket "$S" optimize "$W/problems" "${FLAGS[@]}" --llm "$URL" --json "$W/first.json" 2>"$W/first.log"
rc1=$?
t1=$(date +%s)
kill "$EP" 2>/dev/null
"$K" --socket "$S" optimize "$W/problems" "${FLAGS[@]}" --replay 1 --json "$W/replay.json" 2>"$W/replay.log"
rc2=$?
t2=$(date +%s)
"$K" --socket "$S" report --json >"$W/daemon-report.json" 2>/dev/null
"$K" --socket "$S" shutdown >/dev/null 2>&1 || true
tail -n 30 "$W/first.log" >"$OUT/first-tail.txt"; tail -n 30 "$W/replay.log" >"$OUT/replay-tail.txt"
python3 scripts/device/llm_search_summary.py "$W" "$rc1" "$rc2" "$((t1 - t0))" "$((t2 - t1))" "$LLM_DIR/expect.json" >"$OUT/table.txt"
cp "$W/llm_search.json" "$OUT/" 2>/dev/null
cat "$OUT/table.txt"
