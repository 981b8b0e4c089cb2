"""scripts/device/campaign_jobs.py on a store of a few jobs and regions: the per-kind table and the
jobs that waited longest for regions, named by their labels."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
S = 1_000_000_000  # ns


def store(path: Path) -> None:
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE jobs (id INTEGER, label TEXT, queued_ns INTEGER, started_ns INTEGER, ended_ns INTEGER)")
    c.execute("CREATE TABLE regions (job INTEGER, wait_ms REAL, granted_ns INTEGER, released_ns INTEGER)")
    c.executemany("INSERT INTO jobs VALUES (?, ?, ?, ?, ?)", [
        (1, "optimize:dispatch:level3/004_decoder", 0, 10 * S, 470 * S),
        (2, "optimize:dispatch:level3/007_mobilenet", 0, 5 * S, 470 * S),
        (3, "verify:level1/016_silu", 0, None, 100 * S),  # never started: no regions
    ])
    c.executemany("INSERT INTO regions VALUES (?, ?, ?, ?)", [
        (1, 300_000.0, 400 * S, 410 * S), (1, 20_000.0, 420 * S, 426 * S),
        (2, 5_000.0, 20 * S, 200 * S), (2, 1_000.0, 210 * S, 395 * S), (2, 0.0, 430 * S, None),
    ])
    c.commit()


def test_the_jobs_that_waited_longest_for_regions_are_named(tmp_path: Path) -> None:
    db, out = tmp_path / "store.db", tmp_path / "jobs.json"
    store(db)
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "device" / "campaign_jobs.py"), str(db), str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    waits = data["longest_region_waits"]
    assert [w["label"] for w in waits] == ["optimize:dispatch:level3/004_decoder", "optimize:dispatch:level3/007_mobilenet"]
    assert waits[0] == {"job": 1, "label": "optimize:dispatch:level3/004_decoder", "running_s": 460.0, "regions": 2,
                        "region_wait_s": 320.0, "region_s": 16.0}
    assert (waits[1]["regions"], waits[1]["region_wait_s"], waits[1]["region_s"]) == (3, 6.0, 365.0)
    assert data["optimize:dispatch"]["jobs"] == 2 and data["verify"]["never_started"] == 1
    assert r.stdout.rstrip().splitlines()[-2].startswith("optimize:dispatch:level3/004_decoder")
