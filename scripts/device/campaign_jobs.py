"""Where a campaign call's time went, from the daemon's store: per kind of job (the label's first
two parts: optimize:dispatch, optimize:result, optimize:config, verify), the count, the median and
total seconds queued (admitted late: slots or memory), running, waiting for regions (frozen behind
a sibling's exclusive region) and inside regions (exclusive GPU time); and how many never started
(queued until the call ended them).

    python3 scripts/device/campaign_jobs.py STORE.db OUT.json

Prints the table last."""

from __future__ import annotations

import json
import sqlite3
import statistics
import sys
from collections import defaultdict
from typing import Any, Dict, List


def kind(label: str) -> str:
    parts = (label or "unlabelled").split(":")
    return ":".join(parts[:2]) if parts[0] == "optimize" else parts[0]


def summarize(db: str) -> Dict[str, Dict[str, Any]]:
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    regions: Dict[int, List[float]] = defaultdict(lambda: [0.0, 0.0])
    for job, wait_ms, granted, released in c.execute(
            "SELECT job, wait_ms, granted_ns, released_ns FROM regions WHERE job IS NOT NULL"):
        regions[job][0] += wait_ms / 1e3
        if released is not None:
            regions[job][1] += (released - granted) / 1e9
    rows: Dict[str, Dict[str, List[float]]] = defaultdict(lambda: defaultdict(list))
    for jid, label, queued, started, ended in c.execute(
            "SELECT id, label, queued_ns, started_ns, ended_ns FROM jobs"):
        r = rows[kind(label)]
        r["queued_s"].append(((started or ended or queued) - queued) / 1e9)
        # A job that never started (queued until the call ended it) ran for no time.
        r["running_s"].append(((ended or started) - started) / 1e9 if started else 0.0)
        r["never_started"].append(0.0 if started else 1.0)
        wait, inside = regions.get(jid, [0.0, 0.0])
        r["region_wait_s"].append(wait)
        r["region_s"].append(inside)
    out: Dict[str, Dict[str, Any]] = {}
    for k, r in sorted(rows.items()):
        out[k] = {"jobs": len(r["queued_s"])}
        for name, values in r.items():
            if name == "never_started":
                out[k][name] = int(sum(values))
                continue
            out[k][name] = {"median": round(statistics.median(values), 2), "total": round(sum(values), 1)}
    return out


def main() -> int:
    db, dest = sys.argv[1], sys.argv[2]
    out = summarize(db)
    with open(dest, "w") as f:
        json.dump(out, f, indent=1)
    cols = ("queued_s", "running_s", "region_wait_s", "region_s")
    print(f"{'JOBS OF':<20} {'N':>4} {'NEVER RAN':>9} " + " ".join(f"{c + ' med/total':>22}" for c in cols))
    for k, v in out.items():
        cells = " ".join(f"{v[c]['median']:>10.1f} / {v[c]['total']:>9.1f}" for c in cols)
        print(f"{k:<20} {v['jobs']:>4} {v['never_started']:>9} {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
