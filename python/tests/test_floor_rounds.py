"""scripts/analysis/floor_rounds.py over a small store: the rounds of an inspect job's noise
floor, in region order, with the floor ``kforge inspect`` computes from them."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import List

from kforge.harness import noise_floor
from kforge.inspect import restitch
from scriptload import analysis_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "scripts" / "analysis" / "floor_rounds.py")

#: The columns of the daemon store's tables that the script reads (crates/kforge-store/src/lib.rs).
SCHEMA = """
CREATE TABLE jobs (id INTEGER PRIMARY KEY, argv TEXT NOT NULL);
CREATE TABLE regions (id INTEGER PRIMARY KEY, job INTEGER, name TEXT NOT NULL, granted_ns INTEGER NOT NULL,
  wait_ms REAL NOT NULL, drain_ms REAL NOT NULL, settle_ms REAL NOT NULL, frozen_jobs INTEGER NOT NULL,
  gpu_temp_c_granted INTEGER, sm_clock_mhz_granted INTEGER, gpu_temp_c_released INTEGER,
  sm_clock_mhz_released INTEGER, tainted INTEGER NOT NULL, released_ns INTEGER);
CREATE TABLE measurements (id INTEGER PRIMARY KEY, job INTEGER, region INTEGER, name TEXT NOT NULL,
  samples_ms TEXT NOT NULL, valid INTEGER NOT NULL);
"""


def store(path: Path, rounds: List[List[List[float]]], clocks: List[int]) -> None:
    db = sqlite3.connect(path)
    db.executescript(SCHEMA)
    argv = ["kforge", "inspect", "problems/level2/010_gated_mlp_swiglu_bf16.py", "--daemon"]
    db.execute("insert into jobs values (1, ?)", (json.dumps(argv),))
    db.execute("insert into jobs values (2, ?)", (json.dumps(["kforge", "verify", "a.py", "b.py"]),))
    # Granted in reverse id order: the script orders rounds by grant time, not by id.
    for i, (sides, mhz) in enumerate(zip(rounds, clocks)):
        rid = 10 - i
        db.execute("insert into regions values (?, 1, 'inspect:round-trip', ?, 3.0, 0.5, 200.0, 2, 40, ?, 45, ?, 0, ?)",
                   (rid, 1000 + i, mhz, mhz - 15, 1000 + i + 300_000_000))
        for k, xs in enumerate(sides):
            db.execute("insert into measurements (job, region, name, samples_ms, valid) values (1, ?, ?, ?, 1)",
                       (rid, f"inspect:round-trip:{k}", json.dumps(xs)))
    db.execute("insert into regions values (99, 2, 'verify:timing', 5, 0, 0, 0, 0, 40, 1980, 41, 1980, 0, 10)")
    db.commit()
    db.close()


def test_rounds_in_grant_order_with_the_inspect_floor(tmp_path: Path) -> None:
    rounds = [[[6.0, 6.1, 5.9], [6.0, 6.0, 6.0], [6.2, 6.3, 6.1]],
              [[6.0, 9.0, 9.0], [5.9, 6.0, 6.1], [6.0, 6.0, 9.0]],
              [[6.3, 6.2, 6.4], [6.0, 6.0, 6.0], [6.3, 6.3, 6.3]]]
    store(tmp_path / "store.db", rounds, [1980, 1755, 1830])
    out = tmp_path / "floor.json"
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "store.db"), "010_", "--json", str(out)],
                       capture_output=True, text=True, check=True)
    report = json.loads(out.read_text())
    assert list(report) == ["level2/010_gated_mlp_swiglu_bf16"]  # the verify job has no round trip
    job = report["level2/010_gated_mlp_swiglu_bf16"]
    # Round 2's host slowed for one call of each side, not the same one: the medians are 6/9
    # apart, the calls paired agree.
    assert [x["medians_again_over_base"] for x in job["rounds"]] == [6.2 / 6.0, 6.0 / 9.0, 6.3 / 6.3]
    assert [round(x["again_over_base"], 12) for x in job["rounds"]] == [round(6.2 / 6.0, 12), 1.0, 1.0]
    medians = math.exp(noise_floor([math.log(6.2 / 6.0), math.log(6.0 / 9.0), 0.0]))
    assert abs(job["summary"]["floor_of_medians"] - medians) < 1e-12
    assert job["summary"]["mhz_range"] == [1740, 1980]
    expected = math.exp(noise_floor([math.log(6.2 / 6.0), 0.0, 0.0]))
    assert abs(job["summary"]["floor"] - expected) < 1e-12  # the floor kforge inspect reports (paired)
    assert "floor 1.0" in r.stdout and "1980/1965" in r.stdout
    # What the round trip plans now from such rounds: calls from the first (3 a side in 0.3 s),
    # rounds from that and from these three rounds' spread (round 1 is 3 % off: many more).
    plan = job["summary"]["plan"]
    assert (plan["rounds_by_calls"], plan["calls"]) == restitch.round_plan(3, job["rounds"][0]["pair_spread"], 0.3)
    logs = [[math.log(r[k]) for r in job["rounds"]] for k in ("new_over_base", "again_over_base")]
    assert plan["rounds_by_rounds"] == restitch.rounds_for(*logs) > restitch.MAX_ROUNDS
    assert plan["rounds"] == restitch.MAX_ROUNDS
    assert "planned now:" in r.stdout


def test_a_job_of_one_round_has_no_floor(tmp_path: Path) -> None:
    store(tmp_path / "store.db", [[[1.0], [1.0], [1.0]]], [1980])
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "store.db")], capture_output=True, text=True, check=True)
    assert "1 complete round(s) in the store: no floor" in r.stdout


def test_quantile_between_samples() -> None:
    m = analysis_script("floor_rounds")
    assert m.quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.9) == 4.6
    assert m.floor_of([0.01]) == math.inf


KFORGE = ROOT / "target" / "debug" / "kforge"
ROUNDS_JOB = """
import time
import kforge

def busy(ms):
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass

for _ in range(3):
    kforge.do_bench_interleaved([lambda: busy(1.0), lambda: busy(4.0), lambda: busy(1.0)], warmup=1, rep=10,
                                name="inspect:round-trip", device="cpu", min_calls=3)
"""


def test_the_rounds_of_a_real_daemon_store(tmp_path: Path) -> None:
    # A job of the real daemon times three rounds as the inspect round trip names them; the
    # script reads them back from the store the daemon wrote (its real schema, its region and job ids).
    assert KFORGE.exists(), "target/debug/kforge is not built: cargo build -p kforge first (as .ci/run does)"
    sock, db = tmp_path / "k.sock", tmp_path / "store.db"
    (tmp_path / "inspect_rounds.py").write_text(ROUNDS_JOB)
    daemon = subprocess.Popen([str(KFORGE), "--socket", str(sock), "daemon", "--db", str(db), "--reserve-cores", "0",
                               "--freeze", "none"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert daemon.stderr is not None
        first = daemon.stderr.readline()  # said once the socket is bound
        assert "listening on" in first, first
        env = {k: v for k, v in os.environ.items() if k != "KFORGE_SOCKET"}
        env["PYTHONPATH"] = str(ROOT / "python")
        r = subprocess.run([str(KFORGE), "--socket", str(sock), "run", "--device", "cpu", "--", sys.executable,
                            str(tmp_path / "inspect_rounds.py")], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
    finally:
        subprocess.run([str(KFORGE), "--socket", str(sock), "shutdown"], capture_output=True, timeout=30)
        daemon.communicate(timeout=30)  # the store is closed once the daemon has exited
    out = tmp_path / "floor.json"
    subprocess.run([sys.executable, SCRIPT, str(db), "inspect_rounds", "--json", str(out)], capture_output=True, text=True, check=True)
    (job,) = json.loads(out.read_text()).values()
    assert len(job["rounds"]) == 3 and all(r["calls"] == [3, 3, 3] for r in job["rounds"])
    # The sides in order: the new one is the 4x slower (a wide margin: busy loops on a shared machine).
    assert sorted(r["median_ms"][1] / r["median_ms"][0] for r in job["rounds"])[1] > 2.0
    # A floor (three rounds of three busy-loop calls on a shared CI machine: its size says nothing).
    assert math.isfinite(job["summary"]["floor"]) and job["summary"]["floor"] >= 1.0
    assert job["summary"]["mhz_range"] is None  # no GPU: no clocks
    # The daemon's host counters of each round: all cpus (no core reserved), steal and irq read.
    hosts = [r["host"] for r in job["rounds"]]
    assert all(h is not None and h["cpu"] is None and h["steal_ms"] is not None and h["irq_ms"] is not None for h in hosts), hosts
