"""Merge one `scripts/device/suite.sh` call at the large preset (an unpacked suite.tgz folder) into
bench/results/large-suite/large_suite.json, then print the per-problem Markdown table of the README.

    python3 scripts/analysis/large_suite_merge.py CALL SUITE_DIR [--times FILE] [--wall S --parallel N] [--device TEXT]
    python3 scripts/analysis/large_suite_merge.py --table

A task's result from a later call replaces an earlier one's. The task seconds come from the call's
summary.json when it has one (a call cut at its limit has none), else from --times: the call's
progress lines ("HH:MM:SS KEY rc=N S s"), kept from its output. --device names the call's machine
where it is not the file's (`device`): a call on another GPU.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(__file__))
from suite_report import inspect_row, speedup_evidence  # noqa: E402  (one reader of the results)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results" / "large-suite" / "large_suite.json"


def task_seconds(suite: str, times: Optional[str]) -> Dict[str, float]:
    summary = Path(suite).parent / "summary.json"
    if summary.exists():
        return {t["key"]: t["s"] for t in json.loads(summary.read_text()).get("tasks", [])}
    out: Dict[str, float] = {}
    for line in Path(times).read_text().splitlines() if times else []:
        m = re.match(r"\S+ (\S+) rc=-?\d+ ([\d.]+) s$", line.strip())
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def inspect_entry(d: str, name: str, call: str, seconds: Optional[float]) -> Dict[str, Any]:
    r = inspect_row(d, name)
    if not r["ok"]:
        return {"call": call, "ok": False, "reason": r["reason"], "seconds": seconds}
    ci = r["restitch_ci95"]
    return {"call": call, "ok": True, "noise_floor": round(r["noise_floor"], 4), "rounds": r["rounds"],
            "restitch_ratio": round(r["restitch_ratio"], 4), "ci95": [round(ci[0], 4), round(ci[1], 4)] if ci else None,
            "within_noise": r["restitch_within_noise"], "gpu_us": round(r["gpu_us"], 1), "triton": r["triton"],
            "vendor": r["vendor"], "replaceable_share": round(r["replaceable_share"], 3), "seconds": seconds}


def verify_entry(path: str, call: str) -> Dict[str, Any]:
    v = json.loads(Path(path).read_text())
    ev = speedup_evidence(v)
    phases = {k: round(s, 3) for k, s in (v.get("phase_seconds") or {}).items() if "." not in k}
    return {"call": call, "outcome": v["outcome"], "rejected_by": v.get("rejected_by"), "speedup": ev.get("speedup"),
            "ci95": ev.get("ci95"), "seconds": round(phases.get("total", 0.0), 1), "phase_seconds": phases}


def merge(call: str, suite: str, times: Optional[str], wall: Optional[float], parallel: Optional[int],
          device: Optional[str] = None) -> None:
    data = json.loads(RESULTS.read_text())
    secs = task_seconds(suite, times)
    done = 0
    for log in sorted(glob.glob(f"{suite}/inspect-default/*.log")):
        name = os.path.basename(log)[:-4]
        row = data["problems"].setdefault(name, {})
        row["inspect"] = inspect_entry(f"{suite}/inspect-default", name, call, secs.get(f"inspect-default/{name}"))
        done += 1
    for path in sorted(glob.glob(f"{suite}/verify-eager/*.json")):
        name = os.path.basename(path)[:-5]
        data["problems"].setdefault(name, {})["verify"] = verify_entry(path, call)
        done += 1
    summary = Path(suite).parent / "summary.json"
    record: Dict[str, Any] = {"parallel": parallel, "tasks": done, "wall_s": wall}
    if summary.exists():
        s = json.loads(summary.read_text())
        record.update(wall_s=s.get("wall_s"), parallel=s.get("parallel"), memory=s.get("memory"))
    else:
        record["note"] = "cut at the call's limit: the tasks done were packed; no summary (no memory record)"
    if device:
        record["device"] = device
    data["calls"][call] = record
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")
    print(f"call {call}: {done} task results merged into {RESULTS.relative_to(ROOT)}", file=sys.stderr)


def level_of(name: str) -> str:
    hits = glob.glob(str(ROOT / "problems" / "level*" / f"{name}.py"))
    return Path(hits[0]).parent.name[len("level"):] if hits else "?"


def table_row(name: str, r: Dict[str, Any]) -> str:
    i, v = r.get("inspect"), r.get("verify")
    if i and i.get("ok"):
        ci = i.get("ci95") or [float("nan")] * 2
        ins = [f"{i['noise_floor']:.4f}", f"{i['restitch_ratio']:.4f} ({ci[0]:.3f}–{ci[1]:.3f})", f"{i['gpu_us']:.0f}"]
    else:
        ins = ["not reached" if not i else f"failed: {i.get('reason')}", "—", "—"]
    if v:
        verdict = "accepted" if v["outcome"] == "accepted" else f"{v['outcome']} by `{v['rejected_by']}`"
        sp = f"{v['speedup']:.3f}×" if isinstance(v.get("speedup"), (int, float)) else "—"
        ver = [verdict, sp, f"{v['seconds']:.1f}"]
    else:
        ver = ["not reached", "—", "—"]
    return "| " + " | ".join([level_of(name), name, *ins, *ver]) + " |"


def table() -> None:
    problems: Dict[str, Dict[str, Any]] = json.loads(RESULTS.read_text())["problems"]
    print("| level | problem | inspect: floor | T/T0 (95 % CI) | GPU µs/run | verify (eager as candidate): verdict "
          "| speedup vs default compile | s (in flight) |")
    print("|---|---|---|---|---|---|---|---|")
    rows: List[str] = sorted((table_row(n, r) for n, r in problems.items()), key=lambda s: s.split(" | ")[:2])
    print("\n".join(rows))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("call", nargs="?")
    ap.add_argument("suite", nargs="?", help="the unpacked suite.tgz's suite/ folder")
    ap.add_argument("--times")
    ap.add_argument("--wall", type=float)
    ap.add_argument("--parallel", type=int)
    ap.add_argument("--device", help="the call's machine, where it is not the file's")
    ap.add_argument("--table", action="store_true")
    a = ap.parse_args()
    if a.table:
        table()
        return 0
    if not (a.call and a.suite and os.path.isdir(a.suite)):
        ap.error("give CALL and an unpacked suite folder (or --table)")
    merge(a.call, a.suite, a.times, a.wall, a.parallel, a.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
