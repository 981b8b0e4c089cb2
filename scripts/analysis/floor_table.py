"""Per problem, a session's inspect noise floors beside session 31's (issue 17 item 6), from
`floor_rounds.py STORE --json OUT` files: one compact JSON and a Markdown table.

    python3 scripts/analysis/floor_table.py OUT.json --session N --device TEXT --rev REV \
        --default FR.json [FR.json...] [--large FR.json...] [--old bench/results/noise-floor/floors.json]

Per problem: the floor as `kforge inspect` reports it (paired), the floor of the round medians
from the same rounds, rounds × calls, the sum of the sampled calls' times (s), the SM clock range,
the largest steal, irq and run-queue wait of a round (ms), and session 31's floor (of the medians, as measured then) and plan (`planned_now`) beside them.
Prints, per preset, how many are at most 1.01 now and then, and the table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List

GOAL = 1.01


def rows_of(files: List[str], old: Dict[str, Any]) -> Dict[str, Any]:
    """Problem (levelN/NAME) -> its row, from floor_rounds.py --json files (a later file's row wins)."""
    rows: Dict[str, Any] = {}
    for fn in files:
        with open(fn) as f:
            for prob, v in json.load(f).items():
                key = prob.split("problems/")[-1]
                s, rs = v["summary"], v["rounds"]
                was = old.get(key, {})
                rows[key] = {
                    "floor": round(s["floor"], 4), "floor_of_medians": round(s["floor_of_medians"], 4),
                    "rounds": len(rs), "calls": rs[-1]["calls"][0], "first_round_calls": rs[0]["calls"][0],
                    "timed_s": round(sum(sum(c * m for c, m in zip(r["calls"], r["median_ms"])) for r in rs) / 1e3, 1),
                    "sm_mhz_range": s["mhz_range"],
                    # What took the measuring thread's cpu in its worst round (the daemon's region_host).
                    **{f"{h}_max": max((r["host"].get(h, 0) for r in rs if r.get("host")), default=None)
                       for h in ("steal_ms", "irq_ms", "run_delay_ms")},
                    "session31": {"floor_of_medians": was.get("floor_of_medians"), "floor_paired": was.get("floor_paired"),
                                  "planned_now": was.get("planned_now")},
                }
    return rows


def table(preset: str, rows: Dict[str, Any]) -> List[str]:
    """The preset's count line and its Markdown table."""
    now = sum(1 for x in rows.values() if x["floor"] <= GOAL)
    then = sum(1 for x in rows.values() if (x["session31"]["floor_of_medians"] or float("inf")) <= GOAL)
    out = [f"{preset}: {len(rows)} problems, {now} at most {GOAL} now, {then} in session 31; "
           f"sampled calls {sum(x['timed_s'] for x in rows.values()):.1f} s",
           "| problem | session 31 floor (medians) | floor now (paired) | rounds×calls (planned in s31) | rounds×calls now | sampled s |",
           "|---|---|---|---|---|---|"]
    for k, x in sorted(rows.items()):
        p = x["session31"]["planned_now"] or {}
        out.append(f"| {k} | {x['session31']['floor_of_medians']} | {x['floor']:.4f} | {p.get('rounds')}×{p.get('calls')} "
                   f"| {x['rounds']}×{x['calls']} | {x['timed_s']} |")
    return out


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", metavar="OUT.json")
    ap.add_argument("--session", type=int, required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--rev", required=True)
    ap.add_argument("--default", nargs="+", default=[], metavar="FR.json")
    ap.add_argument("--large", nargs="+", default=[], metavar="FR.json")
    ap.add_argument("--old", default="bench/results/noise-floor/floors.json")
    a = ap.parse_args(argv)
    for fn in [a.old, *a.default, *a.large]:
        if not os.path.isfile(fn):
            ap.error(f"{fn}: no such file")
    if not a.default and not a.large:
        ap.error("give --default or --large floor_rounds.py JSON files")
    with open(a.old) as f:
        old = json.load(f)
    presets = {p: rows_of(files, old.get(p, {})) for p, files in (("default", a.default), ("large", a.large)) if files}
    with open(a.out, "w") as f:
        json.dump({"session": a.session, "device": a.device, "rev": a.rev, "presets": presets}, f, indent=1, sort_keys=True)
    for preset, rows in presets.items():
        print("\n".join(table(preset, rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
