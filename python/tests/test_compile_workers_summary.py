"""scripts/device/compile_workers_summary.py (the table of compile_workers.sh) over made-up runs:
its preparing seconds come from the step's own progress lines, its cache hits from each warmed
variant's record, and a run that could not run says why with its log's last lines."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts" / "device"))

import compile_workers_summary as summary  # noqa: E402


def test_the_table_counts_preparing_seconds_cache_hits_and_says_why_a_run_failed(tmp_path: Path) -> None:
    walls = [{"problem": "mha", "workers": 0, "rc": 0, "started": 100.0, "ended": 250.5},
             {"problem": "mha", "workers": 3, "rc": 0, "started": 300.0, "ended": 390.0},
             {"problem": "cnn", "workers": 3, "rc": 1, "started": 400.0, "ended": 410.0}]
    (tmp_path / "walls.jsonl").write_text("".join(json.dumps(w) + "\n" for w in walls))
    (tmp_path / "mha.w0.log").write_text("dispatch: prepared max-autotune (1 of 3) in 60.5 s: ready\n"
                                         "autotune noise\n"
                                         "dispatch: prepared default (2 of 3) in 20.0 s: ready\n")
    (tmp_path / "mha.w0.json").write_text(json.dumps({
        "winner": "default", "fallback": False, "modes": {"default": {"speedup": 1.06}},
        "prepared": {"max-autotune": {"ok": True, "code": "aaa"}, "default": {"ok": True, "code": "bbb"}}}))
    (tmp_path / "mha.w3.log").write_text("dispatch: prepared max-autotune (1 of 3) in 61.0 s: ready\n"
                                         "dispatch: prepared default (2 of 3) in 2.5 s: ready\n")
    (tmp_path / "mha.w3.json").write_text(json.dumps({
        "winner": "default", "fallback": False, "modes": {"default": {"speedup": 1.05}},
        "compile_workers": {"asked": 3, "started": 2},
        "prepared": {"max-autotune": {"ok": True, "code": "aaa"},
                     "default": {"ok": True, "code": "ccc", "warmed": {"ok": True, "seconds": 19.0, "cache_hit": True}},
                     "max-autotune+freezing": {"ok": True, "warmed": {"ok": True, "seconds": 40.0,
                                                                      "cache_hit": False}}}}))
    (tmp_path / "cnn.w3.log").write_text("Traceback (most recent call last):\n  File x\nRuntimeError: boom\n")
    out = tmp_path / "rows.json"
    assert summary.main([str(tmp_path), str(out)]) == 0
    rows = json.loads(out.read_text())["runs"]
    assert [(r["wall_s"], r["prepare_s"]) for r in rows] == [(150.5, 80.5), (90.0, 63.5), (10.0, 0.0)]
    assert (rows[1]["started"], rows[1]["warmed"], rows[1]["cache_hits"]) == (2, 2, 1)
    assert (rows[1]["same_code"], rows[1]["compared"]) == (1, 2), "max-autotune the same, default not"
    assert "compared" not in rows[0] and "compared" not in rows[2], "the run alone, and one that could not run"
    assert (rows[0]["winner"], rows[0]["speedup"], rows[0]["warmed"]) == ("default", 1.06, 0)
    assert rows[2]["why"].endswith("RuntimeError: boom") and "winner" not in rows[2]
    text = summary.table(rows)
    assert "could not run (rc 1)" in text and "default 1.050x" in text and " 1/2 " in text
