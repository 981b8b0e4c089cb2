"""scripts/device/campaign.sh's state pack, run for real on the CPU (the debug kforge, one small
problem): an Inductor cache too large for the pack leaves it, but for its autotuning results
(select_algorithm's timings under ``cache/``, the ``*.best_config`` files), which a fresh
machine's call then starts from. Session 19's caches were 275 MB to 1.1 GB: without this a
max-autotune compile that outlives a call started its benchmarks over on every new machine."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from pathlib import Path
from typing import Dict

import pytest

ROOT = Path(__file__).resolve().parents[2]
KFORGE = ROOT / "target" / "debug" / "kforge"
VECTOR_ADD = ROOT / "tests" / "candidates" / "problems" / "vector_add.py"


def campaign(problems: Path, out: Path, state: Path, cache: Path, **more: str) -> "subprocess.CompletedProcess[str]":
    """One call of campaign.sh on the CPU: the dispatch agent, no re-verification."""
    env: Dict[str, str] = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_")}
    env.update(OUT=str(out), STATE=str(state), K=str(KFORGE), RESERVE_CORES="0", DEVICE="cpu",
               INDUCTOR_CACHE=str(cache), REVERIFY="0", BUDGET_WALL_S="300", **more)
    args = ["--device", "cpu", "--baseline", "default", "--agents", "dispatch", "--rounds", "2", "--jobs", "1"]
    r = subprocess.run(["bash", "scripts/device/campaign.sh", str(problems), *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def one_problem(tmp_path: Path) -> None:
    """`tmp_path/problems`: one small level-1 problem (skips without torch or the debug kforge)."""
    pytest.importorskip("torch")
    if not KFORGE.exists():
        pytest.skip("target/debug/kforge is not built (cargo test builds it)")
    problems = tmp_path / "problems" / "level1"
    problems.mkdir(parents=True)
    (problems / "a.py").write_text(VECTOR_ADD.read_text())


def test_a_cache_too_large_for_the_pack_leaves_its_autotuning_results_in_it(tmp_path: Path) -> None:
    one_problem(tmp_path)
    cache = tmp_path / "cache"
    (cache / "cache").mkdir(parents=True)
    (cache / "ab").mkdir()
    (cache / "cache" / "0123abcd").write_text('{"system": {}, "cache": {}}')  # select_algorithm's timings
    (cache / "ab" / "k.best_config").write_text('{"XBLOCK": 64}')
    with open(cache / "ab" / "compiled.so", "wb") as f:  # the bulk: over the 60 MiB a whole pack is tried for
        f.truncate(61 * 1024 * 1024)
    out, state = tmp_path / "out", tmp_path / "missing.tgz"
    r = campaign(tmp_path / "problems", out, state, cache)
    assert "but for its 2 autotuning results" in r.stdout, r.stdout[-2000:]
    with tarfile.open(out / "campaign.tgz") as t:
        names = set(t.getnames())
    assert {"inductor-cache/cache/0123abcd", "inductor-cache/ab/k.best_config", "machine.txt"} <= names, names
    assert not any(n.endswith("compiled.so") for n in names), names

    # A fresh machine (an empty cache) starts from the pack: the autotuning results, nothing else.
    fresh = tmp_path / "fresh-cache"
    r = campaign(tmp_path / "problems", tmp_path / "out2", out / "campaign.tgz", fresh)
    assert "Inductor's cache: from the pack" in r.stdout, r.stdout[-2000:]
    assert (fresh / "cache" / "0123abcd").read_text() == '{"system": {}, "cache": {}}'
    assert (fresh / "ab" / "k.best_config").read_text() == '{"XBLOCK": 64}'
    assert not (fresh / "ab" / "compiled.so").exists()


def test_autotuning_results_outlive_the_session_in_the_committed_file(tmp_path: Path) -> None:
    """AUTOTUNED: a fresh machine with no pack (a new session) restores this GPU's autotuning
    results from the committed file into its empty cache before the run, and writes them, with
    the cache's own, to $OUT/autotuned.json after it (the next call's AUTOTUNED)."""
    one_problem(tmp_path)
    kept = tmp_path / "autotuned.json"
    kept.write_text(json.dumps({"autotuned": 1, "machines": {"cpu": {"cache/0123abcd": '{"system": {}}'},
                                                            "NVIDIA H200": {"ab/h200.best_config": "{}"}}}))
    cache, out = tmp_path / "cache", tmp_path / "out"
    r = campaign(tmp_path / "problems", out, tmp_path / "missing.tgz", cache, AUTOTUNED=str(kept))
    assert "1 of 1 autotuning results of cpu restored" in r.stdout, r.stdout[-2000:]
    assert (cache / "cache" / "0123abcd").read_text() == '{"system": {}}'
    d = json.loads((out / "autotuned.json").read_text())
    assert "cache/0123abcd" in d["machines"]["cpu"] and d["machines"]["NVIDIA H200"] == {"ab/h200.best_config": "{}"}
    assert len(os.listdir(out)) <= 8, "a call returns at most 8 files"


@pytest.mark.parametrize("budget,hard,said", [
    ("500", "540", "HARD_S=540 is too tight for BUDGET_WALL_S=500: a step's safety net may run to 1.1 × the budget; "
                   "give HARD_S >= 560"),
    ("5x", "600", "BUDGET_WALL_S is whole seconds: got '5x'"),
    ("300", "soon", "HARD_S is whole seconds: got 'soon'"),
])
def test_a_hard_limit_before_the_safety_nets_end_is_refused_before_anything_runs(
        tmp_path: Path, budget: str, hard: str, said: str) -> None:
    """Session 32: HARD_S=540 under a 500 s budget killed a step in its last timing round, past
    which its safety net would have ended it (1.1 × the budget); such a call is refused at once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFORGE_")}
    env.update(OUT=str(tmp_path / "out"), K="/bin/true", BUDGET_WALL_S=budget, HARD_S=hard,
               STATE=str(tmp_path / "state.tgz"))
    r = subprocess.run(["bash", "scripts/device/campaign.sh", str(tmp_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert said in r.stdout, r.stdout + r.stderr
    assert not (tmp_path / "out" / "campaign.json").exists()
