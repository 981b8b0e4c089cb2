"""scripts/analysis/verify_scale_merge.py, issue 17 (b) over several calls and sessions: a call's rows
cut to the kept fields and merged (a later part replaces an earlier one, the other parts kept),
the SKIP list of problems with a verdict, and the table's ratio against the naive harness."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "analysis" / "verify_scale_merge.py"


def run(*args: str) -> str:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=True).stdout


def verify(seconds: float, outcome: str, speedup: float) -> Dict[str, Any]:
    perf = {"gate": "performance", "name": "speedup", "ok": True, "evidence": {"speedup": speedup, "per_round": [1] * 50}}
    return {"exit": 0, "seconds": seconds, "gpu_memory_peak_mib": 4096,
            "verdict": {"outcome": outcome, "rejected_by": None, "gates": [{"checks": [perf]}], "notes": ["x" * 5000],
                        "phase_seconds": {"setup.import-torch": 3.0, "checks": 2.0, "timing": 3.0, "setup.snapshots": 0.1}}}


def test_calls_merge_into_compact_rows_and_the_done_list(tmp_path: Path) -> None:
    kept, call1, call2 = tmp_path / "kept.json", tmp_path / "c1.json", tmp_path / "c2.json"
    first: List[Dict[str, Any]] = [
        {"name": "eager-a", "naive-device": {"exit": 0, "seconds": 5.0}, "verify": verify(12.5, "accepted", 1.01)},
        {"name": "eager-b", "naive-device": {"exit": 0, "seconds": 4.0}},  # cut before its verify
    ]
    call1.write_text(json.dumps(first))
    assert "1/2 problems with a verdict" in run("merge", str(call1), "--kept", str(kept))
    assert run("done", "--kept", str(kept)).split() == ["eager-a"], "b runs again"
    text = kept.read_text()
    assert "per_round" not in text and "xxxxx" not in text and "setup.snapshots" not in text, "compact"
    call2.write_text(json.dumps([{"name": "eager-b", "verify": verify(16.0, "rejected", 0.98)}]))
    run("merge", str(call2), "--kept", str(kept))
    rows = json.loads(kept.read_text())["rows"]
    assert rows[1]["naive-device"]["seconds"] == 4.0, "the earlier call's naive run kept"
    assert rows[1]["verify"]["speedup"] == 0.98
    assert run("done", "--kept", str(kept)).split() == ["eager-a", "eager-b"]
    table = run("table", "--kept", str(kept))
    assert "| eager-a | - | 5.0 | 12.5 | 2.50 | 4.0 | accepted (1.010×) | 3.0 | - | 2.0 | 3.0 | - | - |" in table
    assert "2/2 with a verdict\n- -: 2; verify ÷ naive: median 4.00, max 4.00, 1/2 at most 3" in table


def test_rows_from_calls_on_different_gpus_are_summarized_per_gpu(tmp_path: Path) -> None:
    """Session 15's rows came from an H200, later ones may come from an H100: each row names its
    GPU, a later call on another GPU keeps the earlier rows' names, and each GPU gets its summary."""
    kept, c1, c2 = tmp_path / "kept.json", tmp_path / "c1.json", tmp_path / "c2.json"
    c1.write_text(json.dumps([{"name": "eager-a", "gpu": "NVIDIA H200", "naive-device": {"exit": 0, "seconds": 5.0},
                               "verify": verify(10.0, "accepted", 1.0)}]))
    c2.write_text(json.dumps([{"name": "eager-b", "gpu": "NVIDIA H100 80GB HBM3", "naive-device": {"exit": 0, "seconds": 4.0},
                               "verify": verify(16.0, "rejected", 0.9)}]))
    run("merge", str(c1), "--kept", str(kept))
    run("merge", str(c2), "--kept", str(kept))
    assert [r["gpu"] for r in json.loads(kept.read_text())["rows"]] == ["NVIDIA H200", "NVIDIA H100 80GB HBM3"]
    table = run("table", "--kept", str(kept))
    assert "| eager-a | H200 | 5.0 | 10.0 | 2.00 |" in table and "| eager-b | H100 | 4.0 | 16.0 | 4.00 |" in table
    assert "- H100: 1; verify ÷ naive: median 4.00, max 4.00, 0/1 at most 3" in table
    assert "- H200: 1; verify ÷ naive: median 2.00, max 2.00, 1/1 at most 3" in table


def test_a_warm_verify_is_kept_beside_the_cold_one(tmp_path: Path) -> None:
    """WARM=1's `verify-warm` rows: kept beside the cold verify, its seconds and ratio in the table,
    its verdict named where it differs from the cold one's, and a summary line of its own."""
    kept, call = tmp_path / "kept.json", tmp_path / "c.json"
    call.write_text(json.dumps([
        {"name": "eager-a", "naive-device": {"exit": 0, "seconds": 5.0}, "verify": verify(12.5, "accepted", 1.01),
         "verify-warm": verify(6.0, "accepted", 1.02)},
        {"name": "eager-b", "naive-device": {"exit": 0, "seconds": 4.0}, "verify": verify(16.0, "accepted", 1.0),
         "verify-warm": verify(5.0, "rejected", 0.97)},
    ]))
    run("merge", str(call), "--kept", str(kept))
    rows = json.loads(kept.read_text())["rows"]
    assert rows[0]["verify-warm"]["seconds"] == 6.0 and "per_round" not in kept.read_text()
    table = run("table", "--kept", str(kept))
    assert "| 2.0 | 3.0 | 6.0 | 1.20 |" in table, table
    assert "| 5.0 (rejected) | 1.25 |" in table, table
    assert "- -: 2; verify ÷ naive: median 4.00, max 4.00, 1/2 at most 3\n" \
           "  - warm verifies on this card: 2, through a forking warm worker (`--daemon --warm`); ÷ naive: median 1.25, max 1.25, 2/2 at most 3" in table


def test_a_warm_only_call_adds_its_warm_verify_on_its_own_card(tmp_path: Path) -> None:
    """WARM_ONLY=1's rows: the warm verify added to the cold row (its naive run and GPU kept), its
    ratio against the naive harness of its own call and card, the card named where it differs,
    and a summary line under that card; `done --warm` lists it."""
    kept, cold, warm = tmp_path / "kept.json", tmp_path / "cold.json", tmp_path / "warm.json"
    cold.write_text(json.dumps([{"name": "eager-a", "gpu": "NVIDIA H200", "naive-device": {"exit": 0, "seconds": 5.0},
                                 "verify": verify(15.0, "accepted", 1.01)}]))
    run("merge", str(cold), "--kept", str(kept))
    assert run("done", "--warm", "--kept", str(kept)).split() == []
    warm.write_text(json.dumps([{"name": "eager-a", "gpu": "NVIDIA H100 80GB HBM3",
                                 "naive-device": {"exit": 0, "seconds": 4.0},
                                 "verify-warm": verify(8.0, "accepted", 1.02)}]))
    run("merge", str(warm), "--kept", str(kept))
    row = json.loads(kept.read_text())["rows"][0]
    assert (row["gpu"], row["naive-device"]["seconds"], row["verify"]["seconds"]) == ("NVIDIA H200", 5.0, 15.0)
    assert (row["verify-warm"]["gpu"], row["verify-warm"]["naive_seconds"]) == ("NVIDIA H100 80GB HBM3", 4.0)
    table = run("table", "--kept", str(kept))
    assert "| eager-a | H200 | 5.0 | 15.0 | 3.00 |" in table and "| 8.0 (H100) | 2.00 |" in table, table
    assert "- H100: 0; verify ÷ naive: none yet\n  - warm verifies on this card: 1, through a forking warm worker" in table, table
    assert "median 2.00, max 2.00, 1/1 at most 3" in table
    assert run("done", "--warm", "--kept", str(kept)).split() == ["eager-a"]


def test_merge_without_the_call_file_is_refused(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(SCRIPT), "merge", "--kept", str(tmp_path / "k.json")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "merge needs the call's verify_scale.json" in p.stderr
