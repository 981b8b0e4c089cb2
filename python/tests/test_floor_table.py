"""scripts/analysis/floor_table.py: a session's floors per problem beside session 31's, from
floor_rounds.py --json files, counted against the 1.01 goal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest
from scriptload import analysis_script


def rounds_file(path: Path, problem: str, floor: float, calls: List[int]) -> str:
    rounds: List[Dict[str, Any]] = [
        {"calls": [c, c, c], "median_ms": [2.0, 2.0, 2.0], "host": {"cpu": 0, "steal_ms": 10.0 * i, "irq_ms": 0, "run_delay_ms": 0.5}}
        for i, c in enumerate(calls)]
    data = {f"/w/problems/{problem}": {"summary": {"floor": floor, "floor_of_medians": floor + 0.01, "mhz_range": [1980, 1980]},
                                        "rounds": rounds}}
    path.write_text(json.dumps(data))
    return str(path)


def test_a_sessions_floors_are_tabled_beside_session_31s(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ft = analysis_script("floor_table")
    old = tmp_path / "floors.json"
    old.write_text(json.dumps({"default": {"level1/a": {"floor_of_medians": 1.03, "planned_now": {"rounds": 20, "calls": 900}}},
                               "large": {}}))
    a = rounds_file(tmp_path / "a.json", "level1/a", 1.0051, [15, 800, 800])
    b = rounds_file(tmp_path / "b.json", "level2/b", 1.0123, [15, 15])
    out = tmp_path / "t.json"
    assert ft.main([str(out), "--session", "9", "--device", "H", "--rev", "r", "--default", a, b, "--old", str(old)]) == 0
    d = json.loads(out.read_text())
    row = d["presets"]["default"]["level1/a"]
    assert (row["floor"], row["rounds"], row["calls"], row["first_round_calls"]) == (1.0051, 3, 800, 15)
    assert row["timed_s"] == pytest.approx(3 * 2.0 * (15 + 800 + 800) / 1e3, abs=0.05)
    assert (row["steal_ms_max"], row["irq_ms_max"], row["run_delay_ms_max"]) == (20.0, 0, 0.5)
    assert row["session31"]["floor_of_medians"] == 1.03
    printed = capsys.readouterr().out
    assert "default: 2 problems, 1 at most 1.01 now, 0 in session 31" in printed
    assert "| level1/a | 1.03 | 1.0051 | 20×900 | 3×800 |" in printed
    with pytest.raises(SystemExit):
        ft.main([str(out), "--session", "9", "--device", "H", "--rev", "r", "--old", str(old)])  # no files: named
