"""The end of the logs of a campaign call's steps that did not finish, for the call's
``progress-tail.txt`` (the logs themselves stay out of the state pack).

``python3 scripts/device/campaign_steps.py failed OUT``: each step of the journal's last run that
failed, its log from its last traceback (the journal's error keeps only the last lines; in session
23 level3/004's measure step failed with torch's CUDA graph trees assertion and its log, which
says where, did not come back). ``... killed OUT``: each step left running when the run was killed,
the end of each log of its problem. ``OUT`` is the campaign's output folder (``journal.db`` in it).
"""

from __future__ import annotations

import glob
import os
import re
import sqlite3
import sys
from typing import List, Tuple


def last_run_steps(out: str, status: str) -> List[Tuple[str, str, str]]:
    """(problem, step, error) of the journal's last run's steps with ``status``."""
    db = sqlite3.connect(f"file:{os.path.join(out, 'journal.db')}?mode=ro", uri=True)
    last = db.execute("SELECT max(id) FROM optimize_runs").fetchone()[0]
    rows = db.execute("SELECT problem, step, COALESCE(error, '') FROM optimize_steps WHERE run=? AND status=?",
                      (last, status)).fetchall()
    return [(str(p), str(s), str(e)) for p, s, e in rows]


def own_lines(lines: List[str]) -> List[str]:
    """A step's own progress lines (stamped ``[HH:MM:SS]``)."""
    return [line for line in lines if line.startswith(("dispatch: ", "config: ", "beam: "))]


def failed(out: str) -> None:
    rows = last_run_steps(out, "failed")
    print(f"\n== {len(rows)} step(s) failed in this call; each log's end from its last traceback (at most 40 lines):")
    for problem, step, error in rows:
        m = re.search(r"\(all of it: (.*?)\)\s*$", error)
        if not m or not os.path.exists(m.group(1)):
            print(f"-- {problem} {step}: no log ({error[:200]})")
            continue
        lines = [line.rstrip() for line in open(m.group(1), errors="replace")]
        starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
        cut = starts[-1] if starts else max(len(lines) - 20, 0)
        tail = lines[cut:]
        print(f"-- {problem} {step} ({os.path.relpath(m.group(1), out)}, {len(lines)} lines):")
        shown = tail[:16] + ["   [...]"] + tail[-18:] if len(tail) > 34 else tail
        for line in own_lines(lines[:cut])[-6:] + shown:
            print("   " + line[:240])


def killed(out: str) -> None:
    rows = last_run_steps(out, "running")
    print(f"\n== {len(rows)} step(s) left running when the run was killed; the end of each log of its problem:")
    for problem, step, _ in rows:
        level, stem = os.path.basename(os.path.dirname(problem)), os.path.splitext(os.path.basename(problem))[0]
        for log in sorted(glob.glob(os.path.join(out, level, stem, "logs", "*.log"))):
            lines = [line.rstrip() for line in open(log, errors="replace") if line.strip()]
            print(f"-- {level}/{stem} (running: {step}) {os.path.basename(log)}, {len(lines)} lines:")
            for line in own_lines(lines[:-4])[-12:] + lines[-4:]:
                print("   " + line[:200])


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("failed", "killed"):
        sys.exit("usage: campaign_steps.py failed|killed OUT")
    (failed if sys.argv[1] == "failed" else killed)(sys.argv[2])
