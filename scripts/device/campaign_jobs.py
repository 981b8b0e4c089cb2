"""Where a campaign call's time went, from the daemon's store: per kind of job (the label's first
two parts: optimize:dispatch, optimize:result, optimize:config, verify), the count, the median and
total seconds queued (admitted late: slots or memory), running, waiting for regions (frozen behind
a sibling's exclusive region) and inside regions (exclusive GPU time); and how many never started
(queued until the call ended them). Then the jobs that waited longest for regions, each with its
label (its step and problem), its regions' count, wait and time inside: whose exclusive regions
held back whose (in session 20 two level-3 measure steps waited 326 s each, median, behind each
other's autotuning benchmarks, and the aggregate could not say which). Then where the regions'
entries went, per kind of job and region name: queued behind other regions, draining siblings'
GPU work (and how many drains timed out: `--drain-timeout-ms`, 2 s), settling, freezing; and how
long the regions were held (median, longest). In session 20 the autotuning benchmarks' regions
were granted after 2.0 and 4.1 s, over and over: a drain's timeout, or a queue?

    python3 scripts/device/campaign_jobs.py STORE.db OUT.json

Prints the tables last."""

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


#: How many jobs the longest-waits table lists.
LONGEST_WAITS = 6


def region_totals(c: sqlite3.Connection) -> Dict[int, List[float]]:
    """Per job: its regions' wait (s), time inside (s) and count."""
    regions: Dict[int, List[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for job, wait_ms, granted, released in c.execute(
            "SELECT job, wait_ms, granted_ns, released_ns FROM regions WHERE job IS NOT NULL"):
        regions[job][0] += (wait_ms or 0.0) / 1e3
        if released is not None and granted is not None:
            regions[job][1] += (released - granted) / 1e9
        regions[job][2] += 1
    return regions


def longest_waits(db: str, n: int = LONGEST_WAITS) -> List[Dict[str, Any]]:
    """The ``n`` jobs that waited longest for regions, longest first."""
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    regions = region_totals(c)
    rows = []
    for jid, label, started, ended in c.execute("SELECT id, label, started_ns, ended_ns FROM jobs"):
        wait, inside, count = regions.get(jid, [0.0, 0.0, 0.0])
        if count:
            running = ((ended or started) - started) / 1e9 if started else 0.0
            rows.append({"job": jid, "label": label or "unlabelled", "running_s": round(running, 1),
                         "regions": int(count), "region_wait_s": round(wait, 1), "region_s": round(inside, 1)})
    return sorted(rows, key=lambda r: -r["region_wait_s"])[:n]


def region_entries(db: str) -> List[Dict[str, Any]]:
    """Per kind of job and region name: the regions' count, their entries' seconds split into
    queued (behind other regions), drain, settle and freeze, the drains and settles that timed
    out, the regions granted tainted (not exclusive: a drain timed out or skipped a straggler, or an
    unmanaged process used the GPU), and the regions' held seconds (median, longest); most waited
    first."""
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    labels = {jid: label for jid, label in c.execute("SELECT id, label FROM jobs")}
    groups: Dict[tuple, Dict[str, Any]] = {}
    for job, name, wait, gate, drain, drained_late, freeze, settle, settled_late, isolate, granted, released, tainted in c.execute(
            "SELECT job, name, wait_ms, gate_ms, drain_ms, drain_timed_out, freeze_ms, settle_ms, settle_timed_out,"
            " isolate_ms, granted_ns, released_ns, tainted FROM regions"):
        key = (kind(labels.get(job, "") or ""), name)
        g = groups.setdefault(key, {"kind": key[0], "region": name, "regions": 0, "wait_s": 0.0, "queued_s": 0.0,
                                    "drain_s": 0.0, "drain_timeouts": 0, "settle_s": 0.0, "settle_timeouts": 0,
                                    "freeze_s": 0.0, "tainted": 0, "held": []})
        steps = sum(x or 0.0 for x in (gate, drain, freeze, settle, isolate))
        g["regions"] += 1
        g["wait_s"] += (wait or 0.0) / 1e3
        g["queued_s"] += max((wait or 0.0) - steps, 0.0) / 1e3
        g["drain_s"] += (drain or 0.0) / 1e3
        g["drain_timeouts"] += int(bool(drained_late))
        g["settle_s"] += (settle or 0.0) / 1e3
        g["settle_timeouts"] += int(bool(settled_late))
        g["freeze_s"] += (freeze or 0.0) / 1e3
        g["tainted"] += int(bool(tainted))
        if granted is not None and released is not None:
            g["held"].append((released - granted) / 1e9)
    rows = []
    for g in groups.values():
        held = g.pop("held")
        g["held_s"] = {"median": round(statistics.median(held), 3) if held else None,
                       "max": round(max(held), 1) if held else None, "total": round(sum(held), 1)}
        rows.append({k: round(v, 1) if isinstance(v, float) else v for k, v in g.items()})
    return sorted(rows, key=lambda r: -r["wait_s"])


def summarize(db: str) -> Dict[str, Dict[str, Any]]:
    c = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    regions = region_totals(c)
    rows: Dict[str, Dict[str, List[float]]] = defaultdict(lambda: defaultdict(list))
    for jid, label, queued, started, ended in c.execute(
            "SELECT id, label, queued_ns, started_ns, ended_ns FROM jobs"):
        r = rows[kind(label)]
        r["queued_s"].append(((started or ended or queued) - queued) / 1e9)
        # A job that never started (queued until the call ended it) ran for no time.
        r["running_s"].append(((ended or started) - started) / 1e9 if started else 0.0)
        r["never_started"].append(0.0 if started else 1.0)
        wait, inside, _ = regions.get(jid, [0.0, 0.0, 0.0])
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
    waits = longest_waits(db)
    entries = region_entries(db)
    with open(dest, "w") as f:
        json.dump({**out, "longest_region_waits": waits, "region_entries": entries}, f, indent=1)
    cols = ("queued_s", "running_s", "region_wait_s", "region_s")
    print(f"{'JOBS OF':<20} {'N':>4} {'NEVER RAN':>9} " + " ".join(f"{c + ' med/total':>22}" for c in cols))
    for k, v in out.items():
        cells = " ".join(f"{v[c]['median']:>10.1f} / {v[c]['total']:>9.1f}" for c in cols)
        print(f"{k:<20} {v['jobs']:>4} {v['never_started']:>9} {cells}")
    print(f"\n{'LONGEST REGION WAITS':<60} {'RUNNING S':>9} {'REGIONS':>7} {'WAIT S':>8} {'INSIDE S':>8}")
    for w in waits:
        print(f"{w['label'][-60:]:<60} {w['running_s']:>9.1f} {w['regions']:>7} {w['region_wait_s']:>8.1f} {w['region_s']:>8.1f}")
    print(f"\n{'REGION ENTRIES (JOBS OF, REGION)':<52} {'N':>5} {'WAIT S':>8} {'QUEUED':>8} {'DRAIN':>7} "
          f"{'LATE':>5} {'SETTLE':>7} {'LATE':>5} {'FREEZE':>7} {'TAINTED':>7} {'HELD MED':>8} {'MAX':>6}")
    for e in entries[:LONGEST_WAITS]:
        held = e["held_s"]
        med = f"{held['median']:.3f}" if held["median"] is not None else "-"
        top = f"{held['max']:.1f}" if held["max"] is not None else "-"
        print(f"{(e['kind'] + ' ' + e['region'])[-52:]:<52} {e['regions']:>5} {e['wait_s']:>8.1f} {e['queued_s']:>8.1f} "
              f"{e['drain_s']:>7.1f} {e['drain_timeouts']:>5} {e['settle_s']:>7.1f} {e['settle_timeouts']:>5} "
              f"{e['freeze_s']:>7.1f} {e['tainted']:>7} {med:>8} {top:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
