"""The table of scripts/device/compile_workers.sh: per problem and number of compile workers, the
measure step's wall seconds, its preparing seconds (the sum of its `dispatch: prepared X (i of n)
in S s` lines), the variants a worker warmed and how many of those hit the FX graph cache, and the
winner with its speedup, and how many variants generated the same code as without workers.

``python3 scripts/device/compile_workers_summary.py RUNS_DIR OUT.json``: RUNS_DIR holds
``walls.jsonl`` (one row per run: problem, workers, rc, started, ended) and each run's
``NAME.wN.json`` and ``NAME.wN.log``; OUT.json gets the rows; the table is printed.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List

PREPARED = re.compile(r"^dispatch: prepared (\S+) \((\d+) of (\d+)\) in ([0-9.]+) s")


def prepared_seconds(log: str) -> float:
    """The seconds the step's own progress lines say it spent preparing variants."""
    return sum(float(m.group(4)) for line in log.splitlines() for m in [PREPARED.match(line)] if m)


def row(runs: Path, wall: Dict[str, Any]) -> Dict[str, Any]:
    stem = f"{wall['problem']}.w{wall['workers']}"
    log_path, json_path = runs / f"{stem}.log", runs / f"{stem}.json"
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    r: Dict[str, Any] = {"problem": wall["problem"], "workers": wall["workers"], "rc": wall["rc"],
                         "wall_s": round(float(wall["ended"]) - float(wall["started"]), 1),
                         "prepare_s": round(prepared_seconds(log), 1)}
    if wall["rc"] != 0 or not json_path.exists():
        r["why"] = " | ".join(log.strip().splitlines()[-3:])  # the traceback's last lines
        return r
    m = json.loads(json_path.read_text())
    warmed = [p["warmed"] for p in m.get("prepared", {}).values() if isinstance(p.get("warmed"), dict)]
    winner = m.get("winner")
    r.update(started=(m.get("compile_workers") or {}).get("started", 0), warmed=len(warmed),
             cache_hits=sum(1 for w in warmed if w.get("cache_hit")), winner=winner,
             speedup=(m.get("modes", {}).get(winner) or {}).get("speedup"), fallback=m.get("fallback"))
    return r


def same_code(runs: Path, rows: List[Dict[str, Any]]) -> None:
    """Per run with workers, how many of its variants generated the code (autotune choices
    included) the same problem's run without workers did (``code`` in each variant's record):
    ``same_code`` of ``compared``. Workers autotune beside the step's own first calls (the
    same job, not frozen by its regions), so a choice may differ; so may two isolated runs'."""
    def codes(r: Dict[str, Any]) -> Dict[str, str]:
        path = runs / f"{r['problem']}.w{r['workers']}.json"
        if not path.exists():
            return {}
        prepared = json.loads(path.read_text()).get("prepared", {})
        return {v: p["code"] for v, p in prepared.items() if isinstance(p, dict) and p.get("code")}

    alone = {r["problem"]: codes(r) for r in rows if r["workers"] == 0 and "why" not in r}
    for r in rows:
        if r["workers"] == 0 or "why" in r or r["problem"] not in alone:
            continue
        mine, base = codes(r), alone[r["problem"]]
        both = [v for v in mine if v in base]
        r["compared"], r["same_code"] = len(both), sum(1 for v in both if mine[v] == base[v])


def table(rows: List[Dict[str, Any]]) -> str:
    lines = [f"{'PROBLEM':40} {'WORKERS':>7} {'WALL-S':>7} {'PREPARE-S':>9} {'WARMED':>6} {'HITS':>4} {'SAME-CODE':>9}  WINNER"]
    for r in rows:
        if "why" in r:
            lines.append(f"{r['problem']:40} {r['workers']:>7} {r['wall_s']:>7} {r['prepare_s']:>9}   could not run "
                         f"(rc {r['rc']}): {r['why']}")
            continue
        won = r["winner"] if r["fallback"] else f"{r['winner']} {r['speedup']:.3f}x"
        same = f"{r['same_code']}/{r['compared']}" if "compared" in r else "-"
        lines.append(f"{r['problem']:40} {r['started']:>7} {r['wall_s']:>7} {r['prepare_s']:>9} {r['warmed']:>6} "
                     f"{r['cache_hits']:>4} {same:>9}  {won}")
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    runs, out = Path(argv[0]), Path(argv[1])
    walls = [json.loads(line) for line in (runs / "walls.jsonl").read_text().splitlines() if line.strip()]
    rows = [row(runs, w) for w in walls]
    same_code(runs, rows)
    out.write_text(json.dumps({"runs": rows}, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
