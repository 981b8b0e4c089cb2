"""The config agent's roofline against its own search, per kernel (issue 18: where a goal is missed
and why; is ROOF_SKIP (1.02 of the measured bandwidth) the right place to stop tuning?).

    python3 scripts/analysis/roofline_table.py RESULT.json... [--json OUT.json]

Each RESULT.json is what ``python3 -m kforge.optimize.config`` wrote (best run with
``--roof-skip 2``, so that every kernel is searched whatever its roofline). One row per kernel
with a roofline row: its least traffic per launch, the fraction of the device's bandwidth it moves at,
its ceiling, and what the search found for it (its kernel-level speedup, or why none: skipped at
its roof, not selected, failed). The last lines count, among the kernels that were searched, how
many the ROOF_SKIP rule would have left untuned and whether any of those won beyond noise.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from kforge.inspect.roofline import ROOF_SKIP  # noqa: E402  (the config agent's default; no torch import)


def rows_of(path: str, result: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One row per kernel the result's roofline has."""
    roof = result.get("roofline") or {}
    kernels = result.get("kernels") or {}
    skipped = result.get("skipped") or {}
    problem = os.path.basename(str(result.get("problem") or path)).removesuffix(".py").removesuffix(".json")
    out: List[Dict[str, Any]] = []
    for name, r in sorted((roof.get("kernels") or {}).items()):
        k = kernels.get(name)
        if k is None:
            why = str(result.get("why") or "")
            found = ("skipped: " + skipped[name][:60] if name in skipped else
                     "not searched (pruned)" if why.startswith("not searched") else "not selected")
            speedup: Optional[float] = None
        elif k.get("error"):
            found, speedup = "failed", None
        else:
            speedup = k.get("speedup")
            found = "won" if k.get("fallback") is False else "kept"
        out.append({"problem": problem, "kernel": name, "kind": r.get("kind"), "gb": (r.get("bytes") or 0) / 1e9,
                    "us": r.get("us_per_launch"), "of_peak": r.get("of_peak"), "ceiling": r.get("ceiling"),
                    "why": r.get("why"), "found": found, "speedup": speedup,
                    "peak_tb_s": (roof.get("peak_bytes_per_s") or 0) / 1e12})
    return out


def verdict(rows: Sequence[Dict[str, Any]], skip_at: float = ROOF_SKIP) -> Dict[str, Any]:
    """Among the searched kernels with a ceiling: those at or above ``skip_at`` and what they won."""
    searched = [r for r in rows if r["found"] in ("won", "kept") and r["ceiling"] is not None]
    above = [r for r in searched if (r["of_peak"] or 0) >= skip_at]
    return {"searched_with_roofline": len(searched), "at_or_above_skip": len(above),
            "won_above_skip": [f"{r['problem']}:{r['kernel']} {r['speedup']:.3f}x" for r in above if r["found"] == "won"],
            "best_speedup_above_skip": max((r["speedup"] or 1.0 for r in above), default=None)}


def fmt(x: Any, f: str) -> str:
    return f % x if isinstance(x, (int, float)) else "-"


def table(rows: Sequence[Dict[str, Any]], v: Dict[str, Any]) -> str:
    lines = [f"{'problem':<34} {'kernel':<46} {'kind':<10} {'GB':>6} {'us':>8} {'of peak':>7} {'ceiling':>7}  found"]
    for r in rows:
        found = r["found"] + (f" {r['speedup']:.3f}x" if r["speedup"] else "")
        lines.append(f"{r['problem'][:34]:<34} {r['kernel'][:46]:<46} {str(r['kind'])[:10]:<10} {r['gb']:>6.2f} "
                     f"{fmt(r['us'], '%.1f'):>8} {fmt(r['of_peak'], '%.3f'):>7} {fmt(r['ceiling'], '%.3f'):>7}  "
                     f"{found}{'  (' + r['why'][:50] + ')' if r['why'] else ''}")
    lines.append(f"searched with a roofline: {v['searched_with_roofline']}; at >= {ROOF_SKIP:.0%} of the device's bandwidth: "
                 f"{v['at_or_above_skip']}; of those won: {len(v['won_above_skip'])} {v['won_above_skip']}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="roofline_table.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="+")
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args(argv)
    rows: List[Dict[str, Any]] = []
    for path in a.results:
        try:
            with open(path) as f:
                result = json.load(f)
        except (OSError, ValueError) as e:
            print(f"roofline_table.py: {path}: {e}", file=sys.stderr)
            return 2
        if result.get("agent") == "config":
            rows.extend(rows_of(path, result))
    v = verdict(rows)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"rows": rows, "verdict": v}, f, indent=1)
    print(table(rows, v))
    return 0


if __name__ == "__main__":
    sys.exit(main())
