#!/usr/bin/env python3
"""Fill in gate 4's confirmed speedup (``Report::confirmed``) of decisions made before reports
recorded it, from the verdicts the same runs wrote.

    python3 scripts/analysis/backfill_confirmed.py DECISIONS OUT [--check]

DECISIONS: a ``kforge optimize --decisions`` file; OUT: the campaign's output folder (a state
pack's ``out/``) that decided them. For each decision of the dispatch family (an improvement by
dispatch, inductor or rewrite) without ``confirmed``, the problem's folder must still hold the
result file it decided: its ``model_new.py`` and ``policy.toml`` hash to the entry's
``result_hash`` (the hash ``kforge optimize`` computes). Its ``verdict.json`` (the verify step's,
of that file) then gives ``performance:speedup``'s measured speedup, as ``Verdict::speedup``
reads it. Entries whose files differ or are missing, and the config and llm agents' (their
verdicts live elsewhere), are left as they are and listed. The file is rewritten in the layout
kforge writes (one entry a line); ``--check`` writes nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

RESULT_FILES = ("model_new.py", "policy.toml")
FAMILY = ("dispatch", "inductor", "rewrite")


def content_hash(parts: List[bytes]) -> str:
    """``kforge_optimize::journal::content_hash``: FNV-1a 64 over each part's length (u64, little
    endian) then its bytes."""
    h = 0xCBF29CE484222325
    for part in parts:
        for b in len(part).to_bytes(8, "little") + part:
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def files_hash(folder: str) -> Optional[str]:
    """``files_hash(out, &RESULT_FILES)``: each name, then its bytes; None when one is missing."""
    parts: List[bytes] = []
    for name in RESULT_FILES:
        try:
            with open(os.path.join(folder, name), "rb") as f:
                parts += [name.encode(), f.read()]
        except OSError:
            return None
    return content_hash(parts)


def gate4_speedup(verdict: Dict[str, Any]) -> Optional[float]:
    """``Verdict::speedup``: the evidence of the check ``performance:speedup``, finite and > 0."""
    for gate in verdict.get("gates", []):
        for check in gate.get("checks", []):
            if check.get("gate") == "performance" and check.get("name") == "speedup":
                x = check.get("evidence", {}).get("speedup")
                return float(x) if isinstance(x, (int, float)) and 0 < x < float("inf") else None
    return None


def folder_of(out: str, problem: str) -> str:
    """The problem's folder in the campaign's output: ``LEVEL/STEM`` below it."""
    level = os.path.basename(os.path.dirname(problem))
    return os.path.join(out, level, os.path.splitext(os.path.basename(problem))[0])


def backfill(entry: Dict[str, Any], out: str) -> Tuple[str, Optional[float]]:
    """What happened to one entry: a word and the confirmed speedup it now has (or None)."""
    report = entry["report"]
    decision = report.get("decision", {})
    if "confirmed" in report:
        return "had it", report["confirmed"]
    if decision.get("kind") != "improved":
        return "not an improvement", None
    if decision.get("agent") not in FAMILY:
        return f"agent {decision.get('agent')}: not read here", None
    folder = folder_of(out, report["problem"])
    if entry.get("result_hash") is None or files_hash(folder) != entry["result_hash"]:
        return "its result file is not in OUT", None
    try:
        with open(os.path.join(folder, "verdict.json"), encoding="utf-8") as f:
            speedup = gate4_speedup(json.load(f))
    except (OSError, ValueError) as e:
        return f"no verdict ({e})", None
    if speedup is None:
        return "its verdict has no gate-4 speedup", None
    report["confirmed"] = speedup
    return "filled", speedup


def write(path: str, d: Dict[str, Any]) -> None:
    """The layout kforge writes: the header, then one compact entry a line, then the undecided
    problems' step floors and carried steps (if any) one a line."""
    def compact(rows: Any) -> str:
        return ",\n".join(json.dumps(r, separators=(",", ":"), ensure_ascii=False) for r in rows)

    floors = ',\n"floors": [\n%s\n]' % compact(d["floors"]) if d.get("floors") else ""
    steps = ',\n"steps": [\n%s\n]' % compact(d["steps"]) if d.get("steps") else ""
    text = '{"decisions": %d,\n"entries": [\n%s\n]%s%s}\n' % (d["decisions"], compact(d["entries"]), floors, steps)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("decisions")
    ap.add_argument("out")
    ap.add_argument("--check", action="store_true", help="say what would be filled, write nothing")
    a = ap.parse_args(argv)
    if not os.path.isdir(a.out):
        print(f"backfill_confirmed: {a.out} is not a folder (a campaign's output, e.g. a state pack's out/)", file=sys.stderr)
        return 2
    def one(e: Dict[str, Any]) -> Tuple[bool, str]:
        what, speedup = backfill(e, a.out)
        shown = f"{speedup:.3f}x" if speedup is not None else "-"
        return what == "filled", f"{shown:>8}  {what}"

    fill_entries(a.decisions, one, a.check)
    return 0


def fill_entries(path: str, one: Callable[[Dict[str, Any]], Tuple[bool, str]], check: bool) -> int:
    """``one`` applied to every entry of the decisions file at ``path`` (it says whether it
    filled the entry in, and a word for the entry's line), each problem's line and the count
    printed, the file rewritten when any was filled (not with ``check``); how many were."""
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    filled = 0
    for e in d["entries"]:
        done, shown = one(e)
        filled += done
        print(f"{e['report']['problem']:<52} {shown}")
    print(f"{filled} filled of {len(d['entries'])} entries")
    if filled and not check:
        write(path, d)
    return filled


if __name__ == "__main__":
    sys.exit(main())
