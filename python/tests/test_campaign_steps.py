"""scripts/device/campaign_steps.py on a journal of a few steps: a failed step's log from its last
traceback (its own progress lines first), a failed step without its log, and a step left running
by a killed run (the end of its problem's logs)."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def journal(out: Path) -> None:
    log = out / "level3" / "004_decoder" / "logs" / "dispatch.log"
    log.parent.mkdir(parents=True)
    log.write_text("dispatch: prepared max-autotune [18:30:01]\nnoise\n"
                   "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: first\n"
                   "dispatch: timing round 3 [18:31:00]\n"
                   "Traceback (most recent call last):\n  File \"cudagraph_trees.py\", line 9\n"
                   "    assert len(node.tensor_weakrefs) == len(node.stack_traces)\nAssertionError\n")
    running = out / "level2" / "001_gemm" / "logs" / "verify.log"
    running.parent.mkdir(parents=True)
    running.write_text("".join(f"line {i}\n" for i in range(10)))
    c = sqlite3.connect(out / "journal.db")
    c.execute("CREATE TABLE optimize_runs (id INTEGER)")
    c.execute("CREATE TABLE optimize_steps (run INTEGER, problem TEXT, step TEXT, status TEXT, error TEXT)")
    c.executemany("INSERT INTO optimize_runs VALUES (?)", [(1,), (2,)])
    c.executemany("INSERT INTO optimize_steps VALUES (?, ?, ?, ?, ?)", [
        (1, "third/level1/013_softmax.py", "measure", "failed", "an earlier run's (all of it: /nowhere)"),
        (2, "third/level3/004_decoder.py", "measure", "failed", f"the dispatch step ended with Some(1): … (all of it: {log})"),
        (2, "third/level3/007_mobilenet.py", "measure", "failed", "ended (all of it: /no/such/dispatch.log)"),
        (2, "third/level2/001_gemm.py", "verify", "running", None),
    ])
    c.commit()


def run(mode: str, out: Path) -> str:
    p = subprocess.run([sys.executable, str(REPO / "scripts/device/campaign_steps.py"), mode, str(out)],
                       capture_output=True, text=True, check=True)
    return p.stdout


def test_a_failed_steps_log_is_shown_from_its_last_traceback(tmp_path: Path) -> None:
    journal(tmp_path)
    text = run("failed", tmp_path)
    assert "== 2 step(s) failed in this call" in text, text
    assert "013_softmax" not in text, "an earlier run's step"
    shown = text.split("-- third/level3/004_decoder.py measure (level3/004_decoder/logs/dispatch.log, 10 lines):")[1]
    lines = [line.strip() for line in shown.splitlines() if line.strip()][:6]
    assert lines[:2] == ["dispatch: prepared max-autotune [18:30:01]", "dispatch: timing round 3 [18:31:00]"], lines
    assert lines[2] == "Traceback (most recent call last):" and lines[-1] == "AssertionError", lines
    assert "ValueError: first" not in text, "only the last traceback"
    assert "-- third/level3/007_mobilenet.py measure: no log (ended (all of it: /no/such/dispatch.log))" in text


def test_a_step_left_running_shows_its_problems_logs_end(tmp_path: Path) -> None:
    journal(tmp_path)
    text = run("killed", tmp_path)
    assert "== 1 step(s) left running when the run was killed" in text, text
    assert "-- level2/001_gemm (running: verify) verify.log, 10 lines:" in text
    assert [line.strip() for line in text.splitlines()[-4:]] == [f"line {i}" for i in range(6, 10)]


def test_a_wrong_mode_is_named(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(REPO / "scripts/device/campaign_steps.py"), "both", str(tmp_path)],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "usage: campaign_steps.py failed|killed OUT" in p.stderr
