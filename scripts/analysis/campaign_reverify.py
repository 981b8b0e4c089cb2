"""Issue 18's re-verification of a campaign's results, made call by call (scripts/device/campaign.sh
with REVERIFY=1): the results a call decided are verified again with `kforge verify` in the same
call, while their files exist (a decisions file carries reports only, not result files), and the rows
are kept in a committed JSON that later calls and sessions add to.

    python3 scripts/analysis/campaign_reverify.py skip CAMPAIGN_JSON OUT_DIR > skip.txt
        the suite.py task keys (verify-results/NAME) of every report folder below OUT_DIR that
        this call did not decide: its problem resumed (from the journal or a decisions file) or without a
        result file; suite.py's SKIP then leaves them out
    python3 scripts/analysis/campaign_reverify.py merge KEPT SUMMARY_JSON OUT_JSON
        KEPT's rows (a file from earlier calls; missing: none) with SUMMARY_JSON's verify-results
        rows (suite.py's summary of this call) merged by result, a later row replacing an earlier
        one, written compact to OUT_JSON; prints "N/M re-verified as decided"
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, List

#: The fields a kept row has (suite.py's verify-results row, its decision column included).
FIELDS = ("candidate", "decision", "decided_speedup", "outcome", "rejected_by", "speedup", "seconds", "agrees")


def task_name(folder: str, out_dir: str) -> str:
    """suite.py's name of a result folder: its path below the output folder, '/' as '__'."""
    return os.path.relpath(folder, out_dir).replace(os.sep, "__")


def skip_keys(campaign: Dict[str, Any], out_dir: str) -> List[str]:
    """The verify-results task keys this call did not decide (see the module's doc)."""
    fresh = {p["problem"][: -len(".py")] if p["problem"].endswith(".py") else p["problem"]
             for p in campaign.get("problems", []) if p.get("decision") and not p.get("resumed")}
    keys = []
    for root, _dirs, files in os.walk(out_dir):
        if "report.json" not in files:
            continue
        rel = os.path.relpath(root, out_dir)
        if rel not in fresh or "model_new.py" not in files:
            keys.append(f"verify-results/{task_name(root, out_dir)}")
    return sorted(keys)


def merged(kept: List[Dict[str, Any]], new: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Rows by result, a later row replacing an earlier one, each cut to FIELDS, ordered by name."""
    rows = {r["candidate"]: r for r in kept}
    for r in new:
        rows[r["candidate"]] = {k: r.get(k) for k in FIELDS}
    return [rows[k] for k in sorted(rows)]


def main(argv: List[str]) -> int:
    if len(argv) == 3 and argv[0] == "skip":
        campaign = json.loads(Path(argv[1]).read_text())
        print("\n".join(skip_keys(campaign, argv[2])))
        return 0
    if len(argv) == 4 and argv[0] == "merge":
        kept_path, summary_path, out_path = (Path(a) for a in argv[1:])
        kept = json.loads(kept_path.read_text())["results"] if kept_path.exists() else []
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        rows = merged(kept, summary.get("verify-results", []))
        out_path.write_text("{\"results\": [\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]}\n")
        print(f"{sum(bool(r.get('agrees')) for r in rows)}/{len(rows)} re-verified as decided")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
