"""Issue 18's re-verification of a campaign's results, made call by call (scripts/device/campaign.sh
with REVERIFY=1): each result is verified again with `kforge verify` where its files exist: in
the call that decided it, in a later call of the same session (its state pack carries the
files) or, since session 29, in any later call (the decisions file carries a decided problem's
result files, and a restore writes them back; entries decided before then carry reports only);
the rows are kept in a committed JSON that later calls and sessions add to.

    python3 scripts/analysis/campaign_reverify.py skip OUT_DIR [KEPT] > skip.txt
        the suite.py task keys (verify-results/NAME) of every report folder below OUT_DIR that
        needs no re-verification here: without a result file (restored from a decisions file
        entry that carries none),
        or with a row in KEPT (earlier calls' rows; missing: none) for the same decision and a
        verdict (not could-not-run); suite.py's SKIP then leaves them out. The last line on
        standard error counts those left to verify
    python3 scripts/analysis/campaign_reverify.py merge KEPT VERDICTS OUT_DIR OUT_JSON
        KEPT's rows with a row per verdict of this call (VERDICTS: suite.py's verify-results
        folder, a NAME.json each, read whether or not suite.py lived to write its summary;
        the decision from OUT_DIR's NAME/report.json) merged by result, a later row replacing
        an earlier one, written compact to OUT_JSON; prints "N/M re-verified as decided".
        DEVICE=cpu: an improvement agrees when it passed without gate 4 (no GPU to time it)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from suite_report import speedup_evidence, write_rows  # noqa: E402  (one reader of the results)

#: The fields a kept row has (suite.py's verify-results row, its decision column included).
FIELDS = ("candidate", "decision", "decided_speedup", "outcome", "rejected_by", "speedup", "seconds", "agrees")


def task_name(folder: str, out_dir: str) -> str:
    """suite.py's name of a result folder: its path below the output folder, '/' as '__'."""
    return os.path.relpath(folder, out_dir).replace(os.sep, "__")


def decided(report: Dict[str, Any]) -> Tuple[Any, Any]:
    """A decision as a row records it: its kind and, for an improvement, its speedup."""
    d = report.get("decision") or {}
    return d.get("kind"), d.get("speedup")


def skip_keys(out_dir: str, kept: List[Dict[str, Any]]) -> List[str]:
    """The verify-results task keys that need no re-verification here (see the module's doc)."""
    done = {r["candidate"]: (r.get("decision"), r.get("decided_speedup")) for r in kept
            if r.get("outcome") not in (None, "could-not-run", "no-verdict")}
    keys = []
    for root, _dirs, files in os.walk(out_dir):
        if "report.json" not in files:
            continue
        name = task_name(root, out_dir)
        with open(os.path.join(root, "report.json")) as f:
            report = json.load(f)
        if "model_new.py" not in files or done.get(name) == decided(report):
            keys.append(f"verify-results/{name}")
    return sorted(keys)


def verdict_rows(verdicts: Path, out_dir: Path) -> List[Dict[str, Any]]:
    """A row per verdict file: the result's decision and its verdict, and whether they agree (an
    improvement accepted again; a kept baseline with any verdict but could-not-run)."""
    improved_ok = ("accepted", "passed-without-performance") if os.environ.get("DEVICE") == "cpu" else ("accepted",)
    rows = []
    for f in sorted(verdicts.glob("*.json")) if verdicts.is_dir() else []:
        name = f.name[: -len(".json")]
        try:
            v = json.loads(f.read_text())
        except ValueError:
            continue  # cut off while written: verified again by a later call
        report = out_dir / name.replace("__", os.sep) / "report.json"
        kind, speedup = decided(json.loads(report.read_text())) if report.exists() else (None, None)
        outcome = v.get("outcome")
        rows.append({"candidate": name, "decision": kind, "decided_speedup": speedup, "outcome": outcome,
                     "rejected_by": v.get("rejected_by"), "speedup": speedup_evidence(v).get("speedup"),
                     "seconds": (v.get("phase_seconds") or {}).get("total"),
                     "agrees": outcome in improved_ok if kind == "improved" else outcome not in (None, "could-not-run")})
    return rows


def read_kept(path: Path) -> List[Dict[str, Any]]:
    return list(json.loads(path.read_text())["results"]) if path.exists() else []


def merged(kept: List[Dict[str, Any]], new: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Rows by result, a later row replacing an earlier one, each cut to FIELDS, ordered by name."""
    rows = {r["candidate"]: r for r in kept}
    for r in new:
        rows[r["candidate"]] = {k: r.get(k) for k in FIELDS}
    return [rows[k] for k in sorted(rows)]


def main(argv: List[str]) -> int:
    if len(argv) in (2, 3) and argv[0] == "skip":
        kept = read_kept(Path(argv[2])) if len(argv) == 3 else []
        keys = skip_keys(argv[1], kept)
        reports = sum(1 for _root, _dirs, files in os.walk(argv[1]) if "report.json" in files)
        print("\n".join(keys))
        print(f"{reports - len(keys)} result(s) to verify again", file=sys.stderr)
        return 0
    if len(argv) == 5 and argv[0] == "merge":
        kept_path, verdicts, out_dir, out_path = (Path(a) for a in argv[1:])
        rows = merged(read_kept(kept_path), verdict_rows(verdicts, out_dir))
        write_rows(out_path, "results", rows)
        print(f"{sum(bool(r.get('agrees')) for r in rows)}/{len(rows)} re-verified as decided")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
