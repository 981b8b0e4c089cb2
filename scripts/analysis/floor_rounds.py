"""The noise floor's rounds of every inspect job in a daemon store (issue 17 item 6): why a
baseline timed against itself moves by more than 1 %.

    python3 scripts/analysis/floor_rounds.py STORE.db [NAME_SUBSTRING] [--json OUT]

STORE.db: an unpacked suite.tgz's suite/store.db (the daemon stopped) or suite/store-snapshot.db
(the copy packed after the last task a call finished, when the call was cut at its limit).

Per inspect job (its problem from the job's command line), one line per round-trip region, in
order: what the region waited for (queue, drain, settle, how many jobs it froze), the SM clock and
temperature at grant and release, what took the measuring thread's cpu meanwhile (the core's
steal and irq ms, the thread's run-queue wait: the daemon's region_host table, since session 31), and per side (baseline, re-stitched, baseline again) the number
of calls, the median in ms and the spread p90/p10 of its calls; then the round's base-again/base
as the ratio of the medians (kforge inspect before session 31) and paired (the median of the
calls' log ratios, call i with call i: `kforge.harness.paired_log`, what it computes since).
Last, per job: the floor as `kforge inspect` computes it (the upper end of the 95 % interval of
the paired log ratios; of the medians' in brackets), the clock's range over the rounds, and the widest within-round spread — a floor
from rounds that differ while each round is tight points at the machine between rounds (clocks,
temperature); a floor from wide rounds points at the calls themselves.
Reads the SQLite store with the standard library; the floor is `kforge.harness.noise_floor`, from
the tree's package (no torch needed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sqlite3
import statistics as st
import sys
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from eval_diagnostics import q as quantile  # noqa: E402  (the analysis scripts' one quantile)
from kforge.harness import noise_floor, pair_spread, paired_log  # noqa: E402  (the tree's package: the floor as kforge inspect computes it)
from kforge.inspect.restitch import MAX_ROUNDS, MIN_ROUNDS, round_plan, rounds_for  # noqa: E402  (imports no torch)

SIDES = ("inspect:round-trip:0", "inspect:round-trip:1", "inspect:round-trip:2")


def floor_of(logs: List[float]) -> float:
    """The rounds' log ratios as a floor ratio (infinite under two rounds)."""
    return math.exp(noise_floor(logs))


def problem_of(argv: str) -> str:
    try:
        args = json.loads(argv)
    except ValueError:
        return argv[:60]
    paths = [a for a in args if isinstance(a, str) and a.endswith(".py")]
    return paths[0].split("/", 1)[-1][:-3] if paths else " ".join(map(str, args))[:60]


def host_of(db: sqlite3.Connection, region: int) -> Optional[Dict[str, Any]]:
    """What took the cpu from the region's measuring thread (the daemon's region_host row, since
    session 31): the core's steal and irq ms and the thread's run-queue wait; None before."""
    if not db.execute("select 1 from sqlite_master where type = 'table' and name = 'region_host'").fetchone():
        return None
    row = db.execute("select cpu, steal_ms, irq_ms, run_delay_ms from region_host where region = ?", (region,)).fetchone()
    return None if row is None else dict(zip(("cpu", "steal_ms", "irq_ms", "run_delay_ms"), row))


def rounds_of(db: sqlite3.Connection, job: int) -> List[Dict[str, Any]]:
    out = []
    q = ("select r.id, r.wait_ms, r.drain_ms, r.settle_ms, r.frozen_jobs, r.sm_clock_mhz_granted, r.sm_clock_mhz_released, "
         "r.gpu_temp_c_granted, r.gpu_temp_c_released, r.tainted, (r.released_ns - r.granted_ns) / 1e9 from regions r "
         "where r.job = ? and r.name = 'inspect:round-trip' order by r.granted_ns")
    for rid, wait, drain, settle, frozen, mhz_g, mhz_r, c_g, c_r, tainted, held_s in db.execute(q, (job,)):
        sides: Dict[str, List[float]] = {}
        for name, samples in db.execute("select name, samples_ms from measurements where region = ? and valid = 1", (rid,)):
            if name in SIDES:
                sides[name] = json.loads(samples)
        if len(sides) < 3 or not all(sides.values()):
            continue
        med = [st.median(sides[s]) for s in SIDES]
        out.append({"region": rid, "wait_ms": wait, "drain_ms": drain, "settle_ms": settle, "frozen_jobs": frozen,
                    "mhz": [mhz_g, mhz_r], "temp_c": [c_g, c_r], "tainted": bool(tainted),
                    "calls": [len(sides[s]) for s in SIDES], "median_ms": med,
                    "spread": [quantile(sides[s], 0.9) / quantile(sides[s], 0.1) for s in SIDES],
                    "medians_again_over_base": med[2] / med[0],
                    "again_over_base": math.exp(paired_log(sides[SIDES[0]], sides[SIDES[2]])),
                    "new_over_base": math.exp(paired_log(sides[SIDES[0]], sides[SIDES[1]])),
                    "pair_spread": pair_spread(*(sides[s] for s in SIDES)), "held_s": held_s,
                    "host": host_of(db, rid)})
    return out


def summary(rounds: List[Dict[str, Any]]) -> Dict[str, Any]:
    clocks = [m for r in rounds for m in r["mhz"] if m]
    return {"floor": floor_of([math.log(r["again_over_base"]) for r in rounds]),
            "floor_of_medians": floor_of([math.log(r["medians_again_over_base"]) for r in rounds]),
            "plan": plan_of(rounds),
            "mhz_range": [min(clocks), max(clocks)] if clocks else None,
            "widest_spread": max(max(r["spread"]) for r in rounds)}


def plan_of(rounds: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """What `kforge inspect` since session 31 plans from rounds like these: calls of each side per
    round from the first round (`restitch.round_plan`), rounds from that and from the first
    MIN_ROUNDS rounds' spread (`restitch.rounds_for`), and the seconds of regions they take as the
    first round's time per call predicts; None without the region's time."""
    first = rounds[0]
    if first["held_s"] is None:
        return None
    calls = min(first["calls"])
    planned, per_round = round_plan(calls, first["pair_spread"], first["held_s"])
    stage = rounds[:MIN_ROUNDS]
    asked = rounds_for([math.log(r["new_over_base"]) for r in stage], [math.log(r["again_over_base"]) for r in stage])
    total = min(MAX_ROUNDS, max(planned, asked))
    return {"rounds": total, "calls": per_round, "rounds_by_calls": planned, "rounds_by_rounds": asked,
            "seconds": round(total * per_round * first["held_s"] / calls, 1)}


def fmt_host(h: Optional[Dict[str, Any]]) -> str:
    """The round's host counters as steal/irq/wait ms (- where missing or not recorded)."""
    if h is None:
        return "-"
    return "/".join("-" if h[k] is None else f"{h[k]:.0f}" for k in ("steal_ms", "irq_ms", "run_delay_ms"))


def fmt_mhz(x: Optional[int]) -> str:
    return "-" if x is None else str(x)


def print_job(problem: str, rounds: List[Dict[str, Any]], s: Dict[str, Any]) -> None:
    plan = s["plan"]
    planned = f"; planned now: {plan['rounds']} rounds of {plan['calls']} calls, {plan['seconds']} s" if plan else ""
    print(f"\n{problem}: floor {s['floor']:.4f} (of the medians {s['floor_of_medians']:.4f}), SM clock {s['mhz_range']} MHz, "
          f"widest p90/p10 {s['widest_spread']:.3f}{planned}")
    print(f"  {'wait ms':>8} {'drain':>6} {'settle':>6} {'froze':>5} {'MHz g/r':>10} {'C g/r':>6} {'calls':>9} "
          f"{'base':>8} {'new':>8} {'again':>8} {'p90/p10 (3 sides)':>20} {'again/base':>10} {'paired':>7} "
          f"{'steal/irq/wait ms':>18}")
    for r in rounds:
        m = r["median_ms"]
        print(f"  {r['wait_ms']:>8.0f} {r['drain_ms']:>6.1f} {r['settle_ms']:>6.0f} {r['frozen_jobs']:>5} "
              f"{fmt_mhz(r['mhz'][0]) + '/' + fmt_mhz(r['mhz'][1]):>10} {fmt_mhz(r['temp_c'][0]) + '/' + fmt_mhz(r['temp_c'][1]):>6} "
              f"{'/'.join(map(str, r['calls'])):>9} {m[0]:>8.3f} {m[1]:>8.3f} {m[2]:>8.3f} "
              f"{' '.join(f'{x:.3f}' for x in r['spread']):>20} {r['medians_again_over_base']:>10.4f} "
              f"{r['again_over_base']:>7.4f} {fmt_host(r['host']):>18}{' tainted' if r['tainted'] else ''}")


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("store", metavar="STORE.db", help="a daemon store (suite/store.db or suite/store-snapshot.db)")
    ap.add_argument("want", metavar="NAME_SUBSTRING", nargs="?", default="", help="only problems whose name holds it")
    ap.add_argument("--json", metavar="OUT", help="also write the rounds and summaries to OUT")
    a = ap.parse_args(argv)
    if not os.path.isfile(a.store):
        ap.error(f"{a.store}: no such file (an unpacked suite.tgz's suite/store.db or suite/store-snapshot.db)")
    args, out_path = [a.store, a.want], a.json
    db = sqlite3.connect(f"file:{args[0]}?mode=ro", uri=True)
    want = args[1] if len(args) > 1 else ""
    jobs = db.execute("select distinct j.id, j.argv from jobs j join measurements m on m.job = j.id "
                      "where m.name = ? order by j.id", (SIDES[0],)).fetchall()
    report = {}
    for job, argv_text in jobs:
        problem = problem_of(argv_text)
        if want not in problem:
            continue
        rounds = rounds_of(db, job)
        if len(rounds) < 2:
            print(f"\n{problem}: {len(rounds)} complete round(s) in the store: no floor")
            continue
        s = summary(rounds)
        print_job(problem, rounds, s)
        report[problem] = {"summary": s, "rounds": rounds}
    if out_path:
        with open(out_path, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
