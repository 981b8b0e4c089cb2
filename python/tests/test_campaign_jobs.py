"""scripts/device/campaign_jobs.py on a store of a few jobs and regions: the per-kind table and the
jobs that waited longest for regions, named by their labels."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Tuple

REPO = Path(__file__).resolve().parents[2]
S = 1_000_000_000  # ns


def store(path: Path) -> None:
    c = sqlite3.connect(path)
    c.execute("CREATE TABLE jobs (id INTEGER, label TEXT, queued_ns INTEGER, started_ns INTEGER, ended_ns INTEGER)")
    c.execute("CREATE TABLE regions (job INTEGER, name TEXT, wait_ms REAL, gate_ms REAL, drain_ms REAL,"
              " drain_timed_out INTEGER, freeze_ms REAL, settle_ms REAL, settle_timed_out INTEGER, isolate_ms REAL,"
              " granted_ns INTEGER, released_ns INTEGER, tainted INTEGER)")
    c.executemany("INSERT INTO jobs VALUES (?, ?, ?, ?, ?)", [
        (1, "optimize:dispatch:level3/004_decoder", 0, 10 * S, 470 * S),
        (2, "optimize:dispatch:level3/007_mobilenet", 0, 5 * S, 470 * S),
        (3, "verify:level1/016_silu", 0, None, 100 * S),  # never started: no regions
    ])
    bench, measure = "auto:inductor.benchmark", "dispatch:round"
    # job, name, wait, gate, drain, drain timed out, freeze, settle, settle timed out, isolate (ms); granted,
    # released; tainted
    c.executemany("INSERT INTO regions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
        (1, bench, 300_000.0, 0.1, 2_000.0, 1, 5.0, 1_500.0, 1, 0.2, 400 * S, 410 * S, 1),
        (1, measure, 20_000.0, 0.1, 40.0, 0, 5.0, 0.0, 0, 0.2, 420 * S, 426 * S, 0),
        (2, bench, 5_000.0, 0.1, 2_000.0, 1, 5.0, 100.0, 0, 0.2, 20 * S, 200 * S, 1),
        (2, bench, 1_000.0, 0.1, 900.0, 0, 5.0, 0.0, 0, 0.2, 210 * S, 395 * S, 1),  # a skipped straggler
        (2, measure, 0.0, 0.0, 0.0, 0, 0.0, 0.0, 0, 0.0, 430 * S, None, 0),
    ])
    c.commit()


def summarized(tmp_path: Path) -> Tuple["subprocess.CompletedProcess[str]", Path]:
    """campaign_jobs.py run on :func:`store`'s jobs: its finished process and its JSON file."""
    db, out = tmp_path / "store.db", tmp_path / "jobs.json"
    store(db)
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "device" / "campaign_jobs.py"), str(db), str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r, out


def test_the_jobs_that_waited_longest_for_regions_are_named(tmp_path: Path) -> None:
    r, out = summarized(tmp_path)
    data = json.loads(out.read_text())
    waits = data["longest_region_waits"]
    assert [w["label"] for w in waits] == ["optimize:dispatch:level3/004_decoder", "optimize:dispatch:level3/007_mobilenet"]
    assert waits[0] == {"job": 1, "label": "optimize:dispatch:level3/004_decoder", "running_s": 460.0, "regions": 2,
                        "region_wait_s": 320.0, "region_s": 16.0}
    assert (waits[1]["regions"], waits[1]["region_wait_s"], waits[1]["region_s"]) == (3, 6.0, 365.0)
    assert data["optimize:dispatch"]["jobs"] == 2 and data["verify"]["never_started"] == 1
    out_lines = r.stdout.rstrip().splitlines()
    longest = out_lines.index(next(l for l in out_lines if l.startswith("LONGEST REGION WAITS")))
    assert out_lines[longest + 1].startswith("optimize:dispatch:level3/004_decoder")


def test_region_entries_split_the_wait_into_queue_drain_settle_and_freeze(tmp_path: Path) -> None:
    r, out = summarized(tmp_path)
    entries = json.loads(out.read_text())["region_entries"]
    assert [(e["kind"], e["region"]) for e in entries] == [
        ("optimize:dispatch", "auto:inductor.benchmark"), ("optimize:dispatch", "dispatch:round")]
    bench = entries[0]
    assert (bench["regions"], bench["wait_s"], bench["drain_timeouts"], bench["settle_timeouts"]) == (3, 306.0, 2, 1)
    # Queued: each wait less its steps (gate, drain, freeze, settle, isolate).
    assert bench["queued_s"] == round((300_000 - 3_505.3 + 5_000 - 2_105.3 + 1_000 - 905.3) / 1e3, 1)
    assert (bench["drain_s"], bench["settle_s"], bench["freeze_s"]) == (4.9, 1.6, 0.0)
    assert (bench["tainted"], entries[1]["tainted"]) == (3, 0), "every region granted tainted, timed out or not"
    assert "TAINTED" in r.stdout
    assert bench["held_s"] == {"median": 180.0, "max": 185.0, "total": 375.0}
    measure = entries[1]
    assert measure["held_s"] == {"median": 6.0, "max": 6.0, "total": 6.0}, "an unreleased region holds nothing"
    assert "REGION ENTRIES" in r.stdout and r.stdout.rstrip().splitlines()[-2].startswith("optimize:dispatch auto:inductor")
