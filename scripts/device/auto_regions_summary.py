"""Summarise `auto_regions.sh`: per run and series p50/p95, inflation against `alone`, and the
regions each run's job entered (from the daemon's store dump).

Usage: python3 auto_regions_summary.py WORKDIR OUT_JSON
WORKDIR holds RUN.json (kb_style_eval.py's output) for each run in RUNS, report.json
(`kforge report --json`) and optionally meta.json (rev, command) and exits.txt (`RUN exit N`
lines). A run that ended without its JSON (killed at its time limit) is still listed, with its
exit status and the regions it entered. Per run: the regions by name, their entry time (gate +
drain + freeze + settle + isolate; p50, max and total) and the drain and settle parts (max).
Prints a table last.
"""
from __future__ import annotations

import json
import os
import sys
from collections import Counter
from typing import Any, Dict, List

RUNS = ("alone", "alone-auto", "beside", "beside-auto")


def quantile(xs: List[float], p: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def regions_by_label(report: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    jobs = {j["id"]: j.get("label") for j in report.get("jobs", [])}
    out: Dict[str, Dict[str, Any]] = {}
    for r in report.get("regions", []):
        label = jobs.get(r.get("job"))
        if label is None:
            continue
        o = out.setdefault(label, {"names": Counter(), "held_ms": 0.0, "enter_ms": [], "frozen_jobs": [],
                                   "revoked": 0, "drain_ms": [], "settle_ms": []})
        o["names"][r["name"]] += 1
        if r.get("released_ns") is not None:
            o["held_ms"] += (r["released_ns"] - r["granted_ns"]) / 1e6
        o["enter_ms"].append(sum(float(r.get(k) or 0.0) for k in ("gate_ms", "drain_ms", "freeze_ms", "settle_ms",
                                                                   "isolate_ms")))
        o["drain_ms"].append(float(r.get("drain_ms") or 0.0))
        o["settle_ms"].append(float(r.get("settle_ms") or 0.0))
        o["frozen_jobs"].append(int(r.get("frozen_jobs") or 0))
        o["revoked"] += bool(r.get("revoked"))
    return out


def summarise(work: str) -> Dict[str, Any]:
    runs: Dict[str, Any] = {}
    for run in RUNS:
        p = os.path.join(work, f"{run}.json")
        if os.path.exists(p):
            with open(p) as f:
                runs[run] = json.load(f)
    with open(os.path.join(work, "report.json")) as f:
        regions = regions_by_label(json.load(f))
    exits: Dict[str, int] = {}
    if os.path.exists(os.path.join(work, "exits.txt")):
        with open(os.path.join(work, "exits.txt")) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[1] == "exit" and parts[2].lstrip("-").isdigit():
                    exits[parts[0]] = int(parts[2])
    for run in RUNS:
        if run not in runs and (run in exits or run in regions):
            runs[run] = {}  # ended without its JSON: its exit status and regions still tell
    meta: Dict[str, Any] = {}
    if os.path.exists(os.path.join(work, "meta.json")):
        with open(os.path.join(work, "meta.json")) as f:
            meta = json.load(f)
    alone = runs.get("alone", {}).get("problems", {})
    summary: Dict[str, Any] = {**meta, "device": next((r.get("device") for r in runs.values()), None), "runs": {}}
    for run, res in runs.items():
        series: Dict[str, Any] = {}
        for problem, methods in res.get("problems", {}).items():
            for method, xs in methods.items():
                row: Dict[str, Any] = {"n": len(xs), "p50_ms": round(quantile(xs, 0.5), 5),
                                       "p95_ms": round(quantile(xs, 0.95), 5)}
                base = alone.get(problem, {}).get(method)
                if base:
                    row["inflation_p50"] = round(quantile(xs, 0.5) / quantile(base, 0.5), 4)
                    row["inflation_p95"] = round(quantile(xs, 0.95) / quantile(base, 0.95), 4)
                series[f"{problem}/{method}"] = row
        reg = regions.get(run, {"names": Counter(), "held_ms": 0.0, "enter_ms": [], "frozen_jobs": [], "revoked": 0,
                                "drain_ms": [], "settle_ms": []})
        enter = reg["enter_ms"]
        summary["runs"][run] = {
            "exit": exits.get(run),
            "wall_s": res.get("wall_s"),
            "series": series,
            "regions": dict(sorted(reg["names"].items())),
            "region_held_ms": round(reg["held_ms"], 1),
            "region_enter_ms_p50": round(quantile(enter, 0.5), 3) if enter else None,
            "region_enter_ms_max": round(max(enter), 3) if enter else None,
            "region_enter_ms_total": round(sum(enter), 1),
            "region_drain_ms_max": round(max(reg["drain_ms"]), 3) if reg["drain_ms"] else None,
            "region_settle_ms_max": round(max(reg["settle_ms"]), 3) if reg["settle_ms"] else None,
            "frozen_jobs_max": max(reg["frozen_jobs"]) if reg["frozen_jobs"] else 0,
            "revoked": reg["revoked"],
        }
    return summary


def table(summary: Dict[str, Any]) -> str:
    lines = [f"{'RUN':<12} {'SERIES':<30} {'P50_MS':>9} {'P95_MS':>9} {'INFL50':>7} {'INFL95':>7}"]
    for run, r in summary["runs"].items():
        for name, s in r["series"].items():
            lines.append(f"{run:<12} {name:<30} {s['p50_ms']:>9.4f} {s['p95_ms']:>9.4f} "
                         f"{s.get('inflation_p50', float('nan')):>7.3f} {s.get('inflation_p95', float('nan')):>7.3f}")
    lines.append(f"{'RUN':<12} {'EXIT':>4} {'WALL_S':>7} {'REGIONS (by name)':<60} {'ENTER_P50/MAX_MS':>17} "
                 f"{'ENTER_S':>7} {'DRAIN/SETTLE_MAX_MS':>19} {'FROZEN':>6}")

    def num(x: Any) -> str:
        return "-" if x is None else f"{x:g}"

    for run, r in summary["runs"].items():
        names = ", ".join(f"{k} {v}" for k, v in r["regions"].items()) or "none"
        enter = f"{num(r['region_enter_ms_p50'])}/{num(r['region_enter_ms_max'])}"
        parts = f"{num(r['region_drain_ms_max'])}/{num(r['region_settle_ms_max'])}"
        lines.append(f"{run:<12} {num(r['exit']):>4} {num(r['wall_s']):>7} {names:<60} {enter:>17} "
                     f"{r['region_enter_ms_total'] / 1e3:>7.2f} {parts:>19} {r['frozen_jobs_max']:>6}")
    return "\n".join(lines)


def main() -> None:
    work, out = sys.argv[1], sys.argv[2]
    summary = summarise(work)
    with open(out, "w") as f:
        json.dump(summary, f, indent=1)
    print(table(summary))


if __name__ == "__main__":
    main()
