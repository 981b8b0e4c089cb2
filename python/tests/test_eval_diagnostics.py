"""scripts/analysis/eval_diagnostics.py over H200 evaluation states cut down to test fixtures
(python/tests/fixtures/eval-state-*/: real manifests, workload lines and store rows of a few
commands, the store as an SQL text dump; python/tests/fixtures/README.md says how they were cut)."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "python" / "tests" / "fixtures"
SCRIPT = str(ROOT / "scripts" / "analysis" / "eval_diagnostics.py")


def state_from(fixture: str, into: Path) -> Path:
    """A state directory built from a fixture: its manifests and workload, and each `STORE.sql`
    dump loaded into the SQLite store `STORE.db` the manifests name."""
    into.mkdir(parents=True, exist_ok=True)
    for f in (FIXTURES / fixture).iterdir():
        if f.suffix == ".sql":
            db = sqlite3.connect(into / f"{f.stem}.db")
            db.executescript(f.read_text())
            db.close()
        else:
            shutil.copy(f, into)
    return into


def unpack_pass3(into: Path) -> None:
    """The third pass's state (both GPUs' truth, one store per GPU), cut down, into `into`."""
    state_from("eval-state-two-gpus", into)


def test_diagnostics_of_the_committed_evaluation(tmp_path: Path) -> None:
    # The first pass: every run on one H200, the truth of its first commands on another.
    state = state_from("eval-state-one-gpu", tmp_path)
    r = subprocess.run([sys.executable, SCRIPT, str(state)],
                       capture_output=True, text=True, check=True)
    lines = r.stdout.splitlines()
    row = next(l for l in lines if l.startswith("eval:region-isolate "))
    assert row.split()[1] == "12"  # commands the fixture's cold region run measured (4 more than the command run's 8)
    # The same-GPU comparison lists the region run relative to the command run.
    assert any(l.startswith("eval:region-isolate rel. to eval:command") for l in lines)
    # Runs on different GPUs are never paired (truth-0 ran on another H200 than the runs).
    assert not any("eval:truth-0 rel. to eval:region" in l or "eval:region-isolate rel. to eval:truth-0" in l for l in lines)


def test_diagnostics_refuses_an_empty_directory(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "no *.run.json manifests" in r.stderr


def test_diagnostics_compare_the_truth_of_two_gpus(tmp_path: Path) -> None:
    # The third pass ran the cold truth on both H200s of one host at once (one store per GPU).
    unpack_pass3(tmp_path)
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path)],
                       capture_output=True, text=True, check=True)
    lines = r.stdout.splitlines()
    head = lines.index(next(l for l in lines if l.startswith("ground truth on GPU B relative to GPU 0 GPU-")))
    rows = [l.split() for l in lines[head + 2:]]
    assert [(x[0], x[2]) for x in rows] == [("1", b) for b in ("<0.1ms", "0.1-1ms", "1-10ms", ">10ms", "all")]
    assert sum(int(x[3]) for x in rows[:4]) == int(rows[4][3]) == 8  # every command of the fixture, in one bucket each
    # GPU 1's own store is read: its truth labels appear in the per-run table.
    assert any(l.startswith("eval:truth-gpu1-0 ") for l in lines)


def test_a_warm_truth_is_left_out_of_the_cross_gpu_comparison_and_labels_stay_in_their_store(tmp_path: Path) -> None:
    unpack_pass3(tmp_path)

    def cross_gpu_rows() -> list[str]:
        out = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True, check=True).stdout
        lines = out.splitlines()
        head = next(i for i, l in enumerate(lines) if l.startswith("ground truth on GPU B"))
        return lines[head:]

    before = cross_gpu_rows()
    # A warm truth on GPU 0 whose medians are another run's (sorted after the cold parts, it
    # would replace GPU 0's reference if it were counted).
    m = json.loads((tmp_path / "truth-0.run.json").read_text())
    m.update(name="truth-warm", warm=True, label="eval:region-warm-nosettle")
    (tmp_path / "truth-warm.run.json").write_text(json.dumps(m))
    assert cross_gpu_rows() == before
    # A label named in two stores is refused, not mixed.
    m2 = json.loads((tmp_path / "region-warm.run.json").read_text())
    m2.update(name="zz-elsewhere", db=m2["db"].replace("kforge-eval.db", "kforge-eval-gpu1.db"))
    (tmp_path / "zz-elsewhere.run.json").write_text(json.dumps(m2))
    r = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "label eval:region-warm is named in two stores" in r.stderr, r.stderr
