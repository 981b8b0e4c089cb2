"""Summarise `autotune_regions.sh`: per compile, its autotune choices against the isolated
compile of the same problem, and the regions its job entered.

Usage: python3 autotune_regions_summary.py WORKDIR OUT_JSON
WORKDIR holds TAG.json (autotune_choices.py's output) per compile — tags alone.P.R (isolated),
plain.I, auto.I, step.I (N at once: no regions, --auto-regions, inductor_regions()) —, report.json
(`kforge report --json`: jobs by label, regions with job, name and pid), meta.json (``close``: a
choice is a close call when the isolated compile's runner-up was within that fraction of its
winner) and exits.txt (`TAG exit N`). The reference of a problem is its first isolated compile;
further isolated ones are compared with it as well (the autotuning's own run-to-run noise).
A compile without its JSON (failed, killed at its time limit) is listed with its exit status.
Prints the agreement table last: per run, how many compiles made the isolated choices exactly.
"""
from __future__ import annotations

import json
import os
import re
import sys
from collections import Counter
from typing import Any, Dict, List, Optional

RUNS = ("alone", "plain", "auto", "step")


def load(path: str) -> Optional[Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def close_calls(ref: Dict[str, Any], close: float) -> Dict[str, bool]:
    """Per choice key of the reference compile: whether its runner-up was within ``close``."""
    out: Dict[str, bool] = {}
    for key in ref.get("choices", {}):
        out[key] = False
    margins: Dict[str, float] = {}
    for kind, items, name in (("select", ref.get("select", []), lambda r: f"{r['op']}({r['inputs']})"),
                              ("config", ref.get("configs", []), lambda r: r["kernel"])):
        seen: Counter = Counter()
        for r in items:
            k = f"{kind}:{name(r)}"
            seen[k] += 1
            margins[k if seen[k] == 1 else f"{k}#{seen[k]}"] = float(r.get("margin", float("inf")))
    for key, m in margins.items():
        out[key] = m < close
    return out


def compare(ref: Dict[str, Any], got: Dict[str, Any], close: float) -> Dict[str, Any]:
    a, b = ref.get("choices", {}), got.get("choices", {})
    keys = sorted(set(a) | set(b))
    differ = [k for k in keys if a.get(k) != b.get(k)]
    near = close_calls(ref, close)
    return {"identical": not differ, "choices": len(keys), "differ": len(differ),
            "differ_close": sum(1 for k in differ if near.get(k, False)),
            "differing": [{"key": k, "isolated": a.get(k), "this": b.get(k), "close_call": near.get(k, False)}
                          for k in differ[:20]],
            "ms_ratio": (got["ms"] / ref["ms"]) if ref.get("ms") and got.get("ms") else None}


def regions_by_label(report: Dict[str, Any], pids: Dict[str, int]) -> Dict[str, Dict[str, Any]]:
    jobs = {j["id"]: j.get("label") for j in report.get("jobs", [])}
    out: Dict[str, Dict[str, Any]] = {}
    for r in report.get("regions", []):
        label = jobs.get(r.get("job"))
        if label is None:
            continue
        o = out.setdefault(label, {"names": Counter(), "main": 0, "other_pid": 0, "revoked": 0})
        o["names"][r["name"]] += 1
        main = pids.get(label)
        if main is not None and r.get("pid") not in (None, main):
            o["other_pid"] += 1
        else:
            o["main"] += 1
        o["revoked"] += bool(r.get("revoked"))
    return out


def summarise(work: str) -> Dict[str, Any]:
    meta = load(os.path.join(work, "meta.json")) or {}
    close = float(meta.get("close", 0.03))
    tags = sorted(f[:-5] for f in os.listdir(work) if re.match(r"^(alone|plain|auto|step)\.[\d.]+\.json$", f))
    exits: Dict[str, int] = {}
    if os.path.exists(os.path.join(work, "exits.txt")):
        for line in open(os.path.join(work, "exits.txt")):
            parts = line.split()
            if len(parts) == 3 and parts[1] == "exit":
                exits[parts[0]] = int(parts[2])
                if parts[0] not in tags:
                    tags.append(parts[0])
    recs = {t: load(os.path.join(work, f"{t}.json")) for t in tags}
    refs: Dict[str, Dict[str, Any]] = {}
    for t in sorted(t for t in tags if t.startswith("alone.")):
        rec = recs.get(t)
        if rec is not None and t.endswith(".1"):
            refs.setdefault(rec["problem"], rec)
    pids = {t: int(r["pid"]) for t, r in recs.items() if r is not None and r.get("pid") is not None}
    regions = regions_by_label(load(os.path.join(work, "report.json")) or {}, pids)
    compiles: Dict[str, Any] = {}
    for t in tags:
        rec = recs.get(t)
        row: Dict[str, Any] = {"exit": exits.get(t), "regions": dict(regions.get(t, {}).get("names", {})),
                               "regions_other_pid": regions.get(t, {}).get("other_pid", 0)}
        if rec is not None:
            row.update(problem=rec["problem"], compile_s=rec.get("compile_s"), ms=rec.get("ms"),
                       benchmarks=rec.get("benchmarks"), n_choices=len(rec.get("choices", {})))
            ref = refs.get(rec["problem"])
            if ref is not None and ref is not rec:
                row["vs_isolated"] = compare(ref, rec, close)
        compiles[t] = row
    runs: Dict[str, Any] = {}
    for run in RUNS:
        rows = [c for t, c in compiles.items() if t.startswith(run + ".") and "vs_isolated" in c]
        mine = [c for t, c in compiles.items() if t.startswith(run + ".")]
        if not mine:
            continue
        ratios = sorted(c["vs_isolated"]["ms_ratio"] for c in rows if c["vs_isolated"]["ms_ratio"] is not None)
        runs[run] = {"compiles": len(mine), "compared": len(rows),
                     "identical": sum(1 for c in rows if c["vs_isolated"]["identical"]),
                     "choices": sum(c["vs_isolated"]["choices"] for c in rows),
                     "differ": sum(c["vs_isolated"]["differ"] for c in rows),
                     "differ_close": sum(c["vs_isolated"]["differ_close"] for c in rows),
                     "ms_ratio_median": ratios[len(ratios) // 2] if ratios else None,
                     "regions": sum(sum(c["regions"].values()) for c in mine),
                     "regions_other_pid": sum(c["regions_other_pid"] for c in mine),
                     "failed": sum(1 for c in mine if c.get("exit") not in (0, None) or "problem" not in c)}
    return {"meta": meta, "runs": runs, "compiles": compiles}


def table(s: Dict[str, Any]) -> str:
    lines = [f"{'run':<6} {'compiles':>8} {'identical':>10} {'choices differ':>15} {'close calls':>11} "
             f"{'ms/isolated':>11} {'regions':>8} {'other pid':>9} {'failed':>6}"]
    for run, r in s["runs"].items():
        ratio = f"{r['ms_ratio_median']:.3f}" if r["ms_ratio_median"] is not None else "-"
        lines.append(f"{run:<6} {r['compiles']:>8} {str(r['identical']) + '/' + str(r['compared']):>10} "
                     f"{str(r['differ']) + '/' + str(r['choices']):>15} {r['differ_close']:>11} {ratio:>11} "
                     f"{r['regions']:>8} {r['regions_other_pid']:>9} {r['failed']:>6}")
    lines.append("identical: compiles whose every choice equals the isolated compile's of the same problem (alone: "
                 "repeats against the first); close calls: differing choices whose runner-up was within "
                 f"{s['meta'].get('close', 0.03):g} of the winner in isolation; other pid: regions of the "
                 "autotune subprocess")
    for t, c in s["compiles"].items():
        v = c.get("vs_isolated")
        if v is not None and not v["identical"]:
            for d in v["differing"][:5]:
                lines.append(f"  {t} {d['key']}: isolated {d['isolated']} | this {d['this']}"
                             + (" (close call)" if d["close_call"] else ""))
    return "\n".join(lines)


def main() -> int:
    work, out = sys.argv[1], sys.argv[2]
    s = summarise(work)
    with open(out, "w") as f:
        json.dump(s, f, indent=1, default=str)
    print(table(s))
    return 0


if __name__ == "__main__":
    sys.exit(main())
