"""scripts/analysis/large_suite_merge.py, the large-preset suite's merge and table: the progress
lines' task seconds, a verdict's entry, a row for a problem not reached, and the committed
large_suite.json rendered with a row per problem."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "analysis" / "large_suite_merge.py"


def merge_module() -> Any:
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("large_suite_merge", SCRIPT)
    assert spec is not None and spec.loader is not None
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_task_seconds_come_from_the_progress_lines_without_a_summary(tmp_path: Path) -> None:
    m = merge_module()
    suite = tmp_path / "suite"
    suite.mkdir()
    times = tmp_path / "times.txt"
    times.write_text("20:14:58 verify-eager/016_silu_bf16 rc=1 24.5 s\n  noise line\n"
                     "20:15:26 inspect-default/009_layernorm_fp32 rc=0 127.0 s\n20:15:27 x rc=-9 3 s\n")
    assert m.task_seconds(str(suite), str(times)) == {"verify-eager/016_silu_bf16": 24.5,
                                                      "inspect-default/009_layernorm_fp32": 127.0, "x": 3.0}
    (tmp_path / "summary.json").write_text(json.dumps({"tasks": [{"key": "k", "s": 1.5}]}))
    assert m.task_seconds(str(suite), str(times)) == {"k": 1.5}, "the summary wins when the call wrote one"


def test_a_verdict_entry_and_its_row(tmp_path: Path) -> None:
    m = merge_module()
    verdict = {"outcome": "rejected", "rejected_by": "performance:speedup",
               "phase_seconds": {"total": 41.26, "correctness": 9.5, "correctness.seed-0": 1.0},
               "gates": [{"gate": "performance", "checks": [
                   {"gate": "performance", "name": "speedup", "ok": False,
                    "evidence": {"speedup": 0.289, "ci95": [0.28, 0.30]}}]}]}
    path = tmp_path / "027_kl_div_bf16.json"
    path.write_text(json.dumps(verdict))
    e = m.verify_entry(str(path), "6")
    assert (e["outcome"], e["rejected_by"], e["speedup"], e["seconds"]) == ("rejected", "performance:speedup", 0.289, 41.3)
    assert e["phase_seconds"] == {"total": 41.26, "correctness": 9.5}, "sub-phases are left out"
    row = m.table_row("027_kl_div_bf16", {"verify": e})
    assert row.startswith("| 1 | 027_kl_div_bf16 | not reached | — | — |")
    assert "rejected by `performance:speedup` | 0.289× | 41.3 |" in row


def test_the_committed_results_render_a_row_per_problem(capsys: pytest.CaptureFixture[str]) -> None:
    m = merge_module()
    m.table()
    lines = capsys.readouterr().out.splitlines()
    problems = json.loads((REPO / "bench" / "results" / "large-suite" / "large_suite.json").read_text())["problems"]
    rows = [ln for ln in lines[2:] if ln.startswith("| ")]
    assert len(rows) == len(problems) == len(list((REPO / "problems").glob("level*/*.py")))
    assert all(" | ? | " not in r for r in rows), "every problem's level found"


def test_a_merged_call_keeps_its_summary_and_the_machine_it_ran_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = merge_module()
    results = tmp_path / "large_suite.json"
    results.write_text(json.dumps({"device": "nvidia-h200", "problems": {}, "calls": {}}))
    monkeypatch.setattr(m, "RESULTS", results)
    monkeypatch.setattr(m, "ROOT", tmp_path)
    suite = tmp_path / "call" / "suite"
    (suite / "verify-eager").mkdir(parents=True)
    (suite / "verify-eager" / "003_gemm_scale_residual_fp32.json").write_text(
        json.dumps({"outcome": "rejected", "rejected_by": "performance:speedup", "phase_seconds": {"total": 22.8}}))
    (tmp_path / "call" / "summary.json").write_text(json.dumps({"wall_s": 258.6, "parallel": 4, "memory": {"jobs": 1}}))
    m.merge("8", str(suite), None, None, None, device="nvidia-h100-x1")
    data = json.loads(results.read_text())
    assert data["calls"]["8"] == {"parallel": 4, "tasks": 1, "wall_s": 258.6, "memory": {"jobs": 1}, "device": "nvidia-h100-x1"}
    assert data["problems"]["003_gemm_scale_residual_fp32"]["verify"]["call"] == "8"
    m.merge("9", str(suite), None, 10.0, 2)  # no device given: the file's
    assert "device" not in json.loads(results.read_text())["calls"]["9"]
