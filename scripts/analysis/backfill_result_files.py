#!/usr/bin/env python3
"""Fill in the result files (``Entry::result_files``: ``model_new.py`` and ``policy.toml``) of
decisions recorded before the decisions file carried them, so that a fresh machine restores the
decided result itself and can verify it again.

    python3 scripts/analysis/backfill_result_files.py DECISIONS [OUT ...] [--regenerate --triton V] [--check]

Each entry without result files but with a ``result_hash`` gets them from the first place where
they hash to exactly that (the hash ``kforge optimize`` computed when it decided):

* ``OUT``: a campaign's output folder (a state pack's ``out/``) whose problem folder still holds
  them;
* ``--regenerate``: made again by ``python3 -m kforge.optimize.result PROBLEM MEASURED --out DIR``
  from the report's own measurement, for a decision of the dispatch family (the result module
  writes a dispatch, inductor or rewrite winner's file from the problem and the measurement
  alone). The problem file must be at the report's path, relative to where this runs. The
  file's header names the torch and Triton it was made with, which a report's measurement does
  not hold: torch is read from the entry's machine (``GPU, torch VERSION``), Triton is
  ``--triton`` (the deciding machine's).

Nothing else is taken: a file that does not hash as decided is not the decided result. Entries
left without are listed with why. The file is rewritten in the layout kforge writes;
``--check`` writes nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from backfill_confirmed import FAMILY, RESULT_FILES, content_hash, files_hash, fill_entries, folder_of  # noqa: E402,F401

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def decided_texts(folder: str, wanted: str) -> Dict[str, str]:
    """The result files in ``folder`` by name, as text, when they hash to ``wanted`` (read once:
    the text kept is the content hashed); none when one is missing, differs or is not text."""
    contents: List[bytes] = []
    for name in RESULT_FILES:
        try:
            with open(os.path.join(folder, name), "rb") as f:
                contents.append(f.read())
        except OSError:
            return {}
    if content_hash([p for n, c in zip(RESULT_FILES, contents) for p in (n.encode(), c)]) != wanted:
        return {}
    try:
        return {n: c.decode("utf-8") for n, c in zip(RESULT_FILES, contents)}
    except UnicodeDecodeError:
        return {}


def regenerated(entry: Dict[str, Any], python: str, triton: Optional[str]) -> Optional[str]:
    """A folder holding the result files made again from the entry's measurement, with the
    versions it was made with (None when the result module failed; its error on stderr)."""
    report = entry["report"]
    work = tempfile.mkdtemp(prefix="kforge-result-")
    measured = os.path.join(work, "measured.json")
    _, sep, version = str(entry.get("machine", "")).rpartition(", torch ")
    torch = version if sep and version else None
    with open(measured, "w", encoding="utf-8") as f:
        json.dump({"versions": {"torch": torch, "triton": triton}, **report["measurement"]}, f)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "python"), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run([python, "-m", "kforge.optimize.result", report["problem"], measured, "--out", work],
                              env=env, capture_output=True, text=True, timeout=600)
        why = None if done.returncode == 0 else f"exited {done.returncode}: {done.stderr.strip()[-400:]}"
    except subprocess.TimeoutExpired:
        why = "ran past 600 s: stopped"
    if why is not None:
        print(f"  {report['problem']}: the result module {why}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
        return None
    return work


def fill(entry: Dict[str, Any], outs: List[str], regenerate: bool, python: str, triton: Optional[str]) -> str:
    """What happened to one entry, in a few words."""
    if entry.get("result_files"):
        return "had them"
    wanted = entry.get("result_hash")
    if wanted is None:
        return "no result_hash (it wrote no result files)"
    report = entry["report"]
    for out in outs:
        folder = folder_of(out, report["problem"])
        texts = decided_texts(folder, wanted)
        if texts:  # (as decided, but not text: looked for further)
            entry["result_files"] = texts
            return f"filled from {out}"
    if not regenerate:
        return "not in any OUT"
    if report.get("decision", {}).get("agent", "dispatch") not in FAMILY or not report.get("measurement"):
        return "not the dispatch family's (or no measurement): not made again here"
    folder = regenerated(entry, python, triton)
    if folder is None:
        return "the result module failed"
    try:
        texts = decided_texts(folder, wanted)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if not texts:
        return "made again, but not as decided (another hash): left out"
    entry["result_files"] = texts
    return "filled: made again, as decided"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("decisions")
    ap.add_argument("outs", nargs="*", metavar="OUT")
    ap.add_argument("--regenerate", action="store_true", help="make a dispatch-family result again from its report")
    ap.add_argument("--python", default=sys.executable, help="the interpreter with torch (for --regenerate)")
    ap.add_argument("--triton", default=None, help="the deciding machine's Triton version (for --regenerate)")
    ap.add_argument("--check", action="store_true", help="say what would be filled, write nothing")
    a = ap.parse_args(argv)
    for out in a.outs:
        if not os.path.isdir(out):
            print(f"backfill_result_files: {out} is not a folder (a campaign's output, e.g. a state pack's out/)",
                  file=sys.stderr)
            return 2
    def one(e: Dict[str, Any]) -> Tuple[bool, str]:
        what = fill(e, a.outs, a.regenerate, a.python, a.triton)
        return what.startswith("filled"), what

    fill_entries(a.decisions, one, a.check)
    return 0


if __name__ == "__main__":
    sys.exit(main())
