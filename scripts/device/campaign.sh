#!/usr/bin/env bash
# Issue 18's H200 campaign: `kforge optimize` over a directory of problems through one daemon,
# chained over device calls with --resume (a call lasts at most 10 minutes; a campaign longer).
#
#   bash scripts/device/campaign.sh PROBLEMS [KFORGE-OPTIMIZE-FLAGS...]
#
# e.g. bash scripts/device/campaign.sh problems --baseline max-autotune --agents dispatch,inductor,rewrite,config --beam-width 3 --jobs 8
#
# State between calls: STATE (default devstate/campaign.tgz, a path in the tree that
# .git/info/exclude ignores and the call carries) holds the output folder (reports, result files,
# the journal) and, when small enough, Inductor's cache (TORCHINDUCTOR_CACHE_DIR: saves compile
# time on a fresh machine; when too large, its autotuning results only; the cache itself lives in devstate/inductor-cache, an ignored path that a
# warm machine keeps between chained calls, whole). Its contents are unpacked before the run; after it, $OUT/campaign.tgz
# is the new state (copy it over STATE for the next call), $OUT/campaign.json and
# $OUT/campaign.html the summary, $OUT/jobs.json where the time went (scripts/device/campaign_jobs.py). BUDGET_WALL_S (default 360) is passed as --budget-wall-s:
# no problem or step starts later, so the call ends inside its limit; problems not reached are
# continued by the next call (--resume); nor does a step that the budget's remainder cannot hold
# (each kind expected to take the upper quartile of the journal's finished ones). HARD_S (default
# BUDGET_WALL_S + 60; refused below 1.1 x BUDGET_WALL_S + 10, where a step's safety net still runs)
# kills the run if a step started before the budget is still running then (its
# step is redone by the next call; a summary pass then writes campaign.json and campaign.html from
# the journal): the state is packed either way, so a long step never costs the call's journal. Builds nothing: carry target/release/kforge and
# target/release/libkforge_shim.so (and STATE).
#
# Across sessions (a fresh tree: devstate/ is gone) the campaign goes on from its decisions file:
# DECISIONS, a committed file (e.g. bench/results/optimize-campaign/default/decisions.json), is
# copied to $OUT/decisions.json and passed as `kforge optimize --decisions`, which adds each
# decision as it is made; copy $OUT/decisions.json over DECISIONS and commit it after every call. REVERIFY=1 (the
# default) then verifies again, through the same daemon, every result whose files are here and
# that REVERIFIED (a committed file of earlier calls' rows, e.g.
# bench/results/optimize-campaign/default/reverified.json) has no verdict for under the same
# decision: `suite.py verify-results` with the other folders skipped
# (scripts/analysis/campaign_reverify.py), its rows merged with REVERIFIED into
# $OUT/reverified.json: copy it over REVERIFIED and commit it too. A result's files exist only on
# the machine that decided it (and in STATE's pack within a session): the decisions file holds
# reports only. CALL_S (default 560): the call's own limit; tasks of the re-verification start
# only while more than VERIFY_TAIL_S (default 90, a verify's time under load) is left of it,
# and what is not reached waits for the next call of the session.
#
# AUTOTUNED, a committed file (e.g. bench/results/optimize-campaign/large-max-autotune/autotuned.json):
# Inductor's autotuning results per GPU (scripts/device/autotuned.py), restored into the cache before
# the run where the cache has none of that name, and written with the cache's own to
# $OUT/autotuned.json after it: copy it over AUTOTUNED and commit it after every call. The state
# pack keeps them within a session; this keeps them across sessions, so a max-autotune compile that
# outlives a call (level3/007's baseline) goes on from the benchmarks the last session finished.
set -uo pipefail
START=$(date +%s)
OUT=${OUT:-/tmp/kforge-out}
mkdir -p "$OUT"
K=${K:-$PWD/target/release/kforge}  # K: another build (e.g. target/debug/kforge to try the script on a CPU)
test -x "$K" || { echo "carry target/release/kforge"; exit 2; }
BUDGET_WALL_S=${BUDGET_WALL_S:-360}  # leaves the re-verification about a minute and a half of CALL_S
case "$BUDGET_WALL_S" in ''|*[!0-9]*) echo "BUDGET_WALL_S is whole seconds: got '$BUDGET_WALL_S'"; exit 2;; esac
HARD_S=${HARD_S:-$((BUDGET_WALL_S + 60))}
# A step admitted under the budget may run to its safety net's end, 1.1 × the remainder past its
# start (SAFETY_END_SHARE in crates/kforge-optimize/src/budget.rs): a HARD_S before that kills the
# run as the step ends (session 32: HARD_S=540 with a 500 s budget killed level3/004's measure step
# in its last timing round).
case "$HARD_S" in ''|*[!0-9]*) echo "HARD_S is whole seconds: got '$HARD_S'"; exit 2;; esac
MIN_HARD_S=$(( BUDGET_WALL_S * 11 / 10 + 10 ))
if [ "$HARD_S" -lt "$MIN_HARD_S" ]; then
  echo "HARD_S=$HARD_S is too tight for BUDGET_WALL_S=$BUDGET_WALL_S: a step's safety net may run to 1.1 × the budget; give HARD_S >= $MIN_HARD_S (or a smaller budget)"
  exit 2
fi
[ $# -ge 1 ] || { echo "usage: campaign.sh PROBLEMS [kforge optimize flags...]"; exit 2; }
PROBLEMS=$1; shift
STATE=${STATE:-devstate/campaign.tgz}
W=$(mktemp -d /tmp/kforge-campaign.XXXXXX)
S=$W/k.sock
mkdir -p "$W/state/out" "$W/state/inductor-cache"
MACHINE=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
MACHINE=${MACHINE:-cpu}
if [ -f "$STATE" ]; then
  tar -xzf "$STATE" -C "$W/state" && echo "state: resumed from $STATE ($(du -sh "$STATE" | cut -f1))"
  # A pack of another GPU's calls (an nvidia-h200
  # call may run on an H100) is not resumed from; the decisions file keeps each machine's apart.
  if [ -f "$W/state/machine.txt" ] && [ "$(cat "$W/state/machine.txt")" != "$MACHINE" ]; then
    echo "state: made on $(cat "$W/state/machine.txt"), this is $MACHINE: not resumed from (the decisions file still is)"
    rm -rf "$W/state/out" && mkdir -p "$W/state/out"  # Inductor's cache is keyed by what it compiled for
  fi
fi
echo "$MACHINE" >"$W/state/machine.txt"
# Inductor's cache lives in the tree (an ignored path), so that a call chained onto a warm machine
# finds the earlier calls' compiles whole, not only what fitted the pack; a fresh machine starts
# from the pack's.
CACHE=${INDUCTOR_CACHE:-$PWD/devstate/inductor-cache}
mkdir -p "$CACHE"
if [ -z "$(ls -A "$CACHE")" ] && [ -n "$(ls -A "$W/state/inductor-cache")" ]; then
  cp -a "$W/state/inductor-cache/." "$CACHE/" && echo "Inductor's cache: from the pack ($(du -sh "$CACHE" | cut -f1))"
else
  echo "Inductor's cache: $CACHE ($(du -sh "$CACHE" | cut -f1), kept on this machine)"
fi
rm -rf "$W/state/inductor-cache" && ln -s "$CACHE" "$W/state/inductor-cache"
if [ -n "${AUTOTUNED:-}" ] && [ -f "$AUTOTUNED" ]; then
  python3 scripts/device/autotuned.py restore "$AUTOTUNED" "$CACHE" --machine "$MACHINE" || echo "autotuned: restore failed (exit $?)"
fi
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=$CACHE
nvidia-smi -L
setsid "$K" --socket "$S" daemon --db "$W/store.db" --reserve-cores "${RESERVE_CORES:-2}" --freeze node --max-concurrent "${PER_GPU:-8}" >"$W/daemon.log" 2>&1 &
for _ in $(seq 200); do "$K" --socket "$S" status >/dev/null 2>&1 && break; sleep 0.05; done
if ! diff -rq --exclude=__pycache__ python/kforge "$S.d/python/kforge" >/dev/null; then
  echo "target/release/kforge embeds another python/kforge than this tree: rebuild and carry it"
  "$K" --socket "$S" shutdown >/dev/null 2>&1; exit 2
fi
t0=$(date +%s)
DECISIONS_ARGS=()
if [ -n "${DECISIONS:-}" ]; then
  [ -f "$DECISIONS" ] && cp "$DECISIONS" "$OUT/decisions.json" && echo "decisions: $DECISIONS ($(grep -c '"decided_unix_s"' "$DECISIONS") decided)"
  DECISIONS_ARGS=(--decisions "$OUT/decisions.json")
fi
timeout --signal=TERM --kill-after=10 "$HARD_S" \
  "$K" --socket "$S" optimize "$PROBLEMS" --daemon --resume --out "$W/state/out" --budget-wall-s "$BUDGET_WALL_S" \
  --json "$OUT/campaign.json" --html "$OUT/campaign.html" ${DECISIONS_ARGS[@]+"${DECISIONS_ARGS[@]}"} "$@" 2>"$W/progress.log"
rc=$?
echo "kforge optimize exited $rc after $(( $(date +%s) - t0 )) s (started $(date -d "@$t0" +%T), ended $(date +%T))"
# The run's own last lines (a summary pass after a kill writes to its own log), then the end of
# each log of a step the run left unfinished (the logs themselves stay out of the pack): what a
# step that outlives a call was doing.
tail -n 40 "$W/progress.log" >"$OUT/progress-tail.txt"
# And the run's events from its whole log (a redecision started, a step bounded, a warning, a
# failure, a decision), which the last 40 lines no longer hold.
{ echo; echo "== events of the whole run (at most 120 lines)"
  grep -E "decided again|left the decisions file|still in the decisions file|bounded:|warning|failed|decided:|starts after the problems" \
    "$W/progress.log" | head -n 120; } >>"$OUT/progress-tail.txt" || true
# Regions held long (the long-hold report of --auto-regions: where the holding thread was), from
# every step's log of this call: the logs themselves do not come back.
{ echo; echo "== steps that left threads running at their exit (at most 20 lines)"
  grep -rh --include='*.log' "leaving .* thread(s) still running" "$W/state/out" | cut -c1-400 | head -n 20
} >>"$OUT/progress-tail.txt" || true
# Timing rounds a step left a mode out of, or timed again for a tainted region (dispatch's log
# lines), and each step's count of autotuning benchmarks timed again so (at its exit).
{ echo; echo "== timing rounds: modes left out, rounds in regions that were not exclusive (at most 40 lines)"
  grep -rH --include='*.log' -E "left out, it raised|again: its region was not exclusive|kept, timed in a region|timed again after a tainted region|timed by one call|timed by that call alone" \
    "$W/state/out" | sed "s|$W/state/out/||" | cut -c1-400 | head -n 40; } >>"$OUT/progress-tail.txt" || true
{ echo; echo "== regions held past half their lease (at most 40 lines)"
  grep -rh --include='*.log' "kforge --auto-regions: region .* held for .* lease; " "$W/state/out" | cut -c1-600 | head -n 40
} >>"$OUT/progress-tail.txt" || true
# Drains that timed out (the daemon's log names each process that had not acknowledged the gate's
# close, its job and its command line): in session 20 the autotuning benchmarks' regions were
# granted after 2.0 or 4.1 s over and over, the drain timeout's 2 s.
{ echo; echo "== drains that timed out: $(grep -c "drain timed out" "$W/daemon.log") (the first 12); stragglers skipped: $(grep -c "drain did not wait for" "$W/daemon.log")"
  grep "drain timed out" "$W/daemon.log" | cut -c1-500 | head -n 12
  grep -e "drain did not wait for" -e "is no longer behind" "$W/daemon.log" | cut -c1-300 | head -n 12
} >>"$OUT/progress-tail.txt" || true
# Jobs run again alone after an out-of-memory error, and jobs started beside the running ones
# while such a job waited at its queue's front (the daemon's backfill).
{ echo; echo "== out-of-memory retries: $(grep -c ": run again, alone" "$W/daemon.log"); backfilled: $(grep -c "started beside the running jobs" "$W/daemon.log") (the first 12 of each)"
  grep ": run again, alone" "$W/daemon.log" | cut -c1-300 | head -n 12
  grep "started beside the running jobs" "$W/daemon.log" | cut -c1-300 | head -n 12
} >>"$OUT/progress-tail.txt" || true
# Steps that failed in this call: each one's log from its last traceback; after a kill, each
# step left running: the end of its problem's logs (scripts/device/campaign_steps.py).
python3 scripts/device/campaign_steps.py failed "$W/state/out" >>"$OUT/progress-tail.txt" ||
  echo "(the failed steps' logs could not be read: exit $?)"
if [ "$rc" = 124 ]; then
  python3 scripts/device/campaign_steps.py killed "$W/state/out" >>"$OUT/progress-tail.txt" ||
    echo "(the unfinished steps' logs could not be read: exit $?)"
  echo "kforge optimize killed at HARD_S (a step outlived the budget): the next call redoes it"
  # The summary the killed run could not write: every decision so far, from the journal, no step
  # started (a spent budget), so that each call's campaign.json and campaign.html hold. Without
  # --redecide: the problems it names are being decided again since the killed run, and the
  # summary takes their new decisions (a flag given again would not take the killed run's).
  SUMMARY_ARGS=()
  skip=0
  for arg in "$@"; do
    if [ "$skip" = 1 ]; then skip=0; continue; fi
    case "$arg" in
      --redecide) skip=1 ;;
      --redecide=*) ;;
      *) SUMMARY_ARGS+=("$arg") ;;
    esac
  done
  "$K" --socket "$S" optimize "$PROBLEMS" --daemon --resume --out "$W/state/out" --budget-wall-s 0.001 \
    --json "$OUT/campaign.json" --html "$OUT/campaign.html" ${DECISIONS_ARGS[@]+"${DECISIONS_ARGS[@]}"} \
    ${SUMMARY_ARGS[@]+"${SUMMARY_ARGS[@]}"} \
    2>"$W/summary.log" >/dev/null || { echo "the summary pass exited $? (its log's end:)"; tail -n 5 "$W/summary.log"; }
fi
# The new state, packed before the re-verification (which writes nothing there): the output
# folder always; Inductor's cache while the pack stays under the 16 MiB a returned file may have,
# else its autotuning results only.
# The steps' logs (out/*/logs) are left out: they grow with every call; progress-tail.txt keeps the end.
# A cache over 60 MiB is not tried (it would not pack under 15 MiB, and gzip of GBs costs the call).
if [ "$(du -sbL "$CACHE" | cut -f1)" -le $((60 * 1024 * 1024)) ] &&
   tar -czhf "$OUT/campaign.tgz" --exclude='*/logs' -C "$W/state" machine.txt out inductor-cache &&
   [ "$(stat -c %s "$OUT/campaign.tgz")" -le $((15 * 1024 * 1024)) ]; then
  :
else
  # Too large whole: its autotuning results alone (a few MiB at most), which a fresh machine's
  # compiles take instead of benchmarking again: the timings of every template choice that
  # select_algorithm benchmarked (cache/<system hash>, written after each op, so an interrupted
  # max-autotune compile keeps what it finished) and each Triton kernel's chosen config
  # (*.best_config). A large max-autotune compile that outlives one call finishes over several.
  (cd "$CACHE" && find . -type f \( -name '*.best_config' -o -path './cache/*' \)) | sed 's|^\./|inductor-cache/|' >"$W/autotuned.txt"
  if [ -s "$W/autotuned.txt" ] &&
     tar -czhf "$OUT/campaign.tgz" --exclude='*/logs' -C "$W/state" machine.txt out --verbatim-files-from -T "$W/autotuned.txt" &&
     [ "$(stat -c %s "$OUT/campaign.tgz")" -le $((15 * 1024 * 1024)) ]; then
    echo "state: Inductor's cache left out ($(du -sh "$CACHE" | cut -f1); the pack holds at most 15 MiB), but for its $(wc -l <"$W/autotuned.txt") autotuning results; the whole stays in $CACHE on this machine"
  else
    echo "state: Inductor's cache left out ($(du -sh "$CACHE" | cut -f1); the pack holds at most 15 MiB; it stays in $CACHE on this machine)"
    tar -czf "$OUT/campaign.tgz" --exclude='*/logs' -C "$W/state" machine.txt out || echo "state: packing failed (exit $?)"
  fi
fi
if [ -n "${AUTOTUNED:-}" ]; then  # the autotuning results across sessions (the pack's last a session)
  python3 scripts/device/autotuned.py export "$CACHE" "$OUT/autotuned.json" --machine "$MACHINE" --kept "$AUTOTUNED" \
    || echo "autotuned: export failed (exit $?)"
fi
REVERIFY_DEADLINE=$(( ${CALL_S:-560} - ($(date +%s) - START) - ${VERIFY_TAIL_S:-90} ))
if [ "${REVERIFY:-1}" = 1 ] && [ "$REVERIFY_DEADLINE" -lt 15 ]; then
  echo "re-verification: not started, ${REVERIFY_DEADLINE} s left of CALL_S after the tail: the next call of the session does it"
elif [ "${REVERIFY:-1}" = 1 ]; then
  # Results whose files are here and that have no verdict yet (issue 18's re-verification).
  python3 scripts/analysis/campaign_reverify.py skip "$W/state/out" "${REVERIFIED:-/nonexistent}" >"$W/reverify-skip.txt"
  mkdir -p "$W/reverify" "$W/reverify-out"
  # No task starts after the deadline, and none outlives the call (killed at CALL_S less 20 s).
  # Each task verifies at its report's size; SIZE only names the campaign's in the log's header.
  SIZE=default; prev=
  for arg in "$@"; do [ "$prev" = --size ] && SIZE=$arg; case $arg in --size=*) SIZE=${arg#--size=} ;; esac; prev=$arg; done
  SIZE="$SIZE" SKIP="$W/reverify-skip.txt" DEADLINE_S="$REVERIFY_DEADLINE" timeout --signal=TERM --kill-after=5 \
    $(( REVERIFY_DEADLINE + ${VERIFY_TAIL_S:-90} - 20 )) python3 scripts/device/suite.py "$K" "$S" "$W/reverify" "$W/reverify-out" "verify-results:$W/state/out" \
    >"$W/reverify.log" 2>&1 || echo "re-verification: suite.py exited $? (tail of its log:)"
  tail -n 8 "$W/reverify.log"
fi
if [ "${REVERIFY:-1}" = 1 ]; then
  DEVICE="${DEVICE:-}" python3 scripts/analysis/campaign_reverify.py merge "${REVERIFIED:-/nonexistent}" \
    "$W/reverify/verify-results" "$W/state/out" "$OUT/reverified.json"
fi
"$K" --socket "$S" shutdown >/dev/null 2>&1 || true
rm -f "$OUT/.decisions.json.lock"  # kforge optimize's lock beside the decisions file: one of the 8 files a call returns
# Where the call's time went (queued, running, waiting for regions, inside them) per kind of job.
python3 scripts/device/campaign_jobs.py "$W/store.db" "$OUT/jobs.json" || echo "campaign_jobs.py failed (exit $?)"
ls -la "$OUT"
grep -c "decided:" "$W/progress.log" | sed 's/^/problems decided in this call: /'
exit $rc
