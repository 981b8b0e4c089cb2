"""scripts/analysis/suite_report.py: an inspect report's row, its noise floor and its rounds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def report(per_round: int, calls: int = 0) -> dict:  # type: ignore[type-arg]
    plan = {"plan": {"rounds": per_round, "calls": calls}} if calls else {}
    return {"graphs": 1, "triton_kernels": 1, "template_kernels": 0, "vendor_calls": 1,
            "attribution": {"total_us": 6130.0, "replaceable_share": 0.1}, "replay": [{"kernel": "k", "ok": True}],
            "restitch": {"identical": True, "ratio": 0.999, "kernels_replaced": 1, "baseline_ms": 6.1, "restitched_ms": 6.1,
                         "ratio_ci95": [0.995, 1.003], "within_noise": True, "noise_floor": 1.0071, "extended": per_round > 5,
                         "timed_against": "the same compile with its original kernels",
                         "per_round": [{"base_ms": 6.1, "new_ms": 6.1, "base_again_ms": 6.1}] * per_round, **plan}}


def test_inspect_rows_carry_the_floor_and_its_rounds(tmp_path: Path) -> None:
    d = tmp_path / "call" / "inspect-default"
    d.mkdir(parents=True)
    for name, n, calls in (("002_gemm_bias_gelu_bf16", 10, 0), ("016_silu_bf16", 7, 480)):
        (d / f"{name}.report.json").write_text(json.dumps(report(n, calls)))
        (d / f"{name}.log").write_text("done\n")
    (d / "009_lstm_unrolled_bf16.log").write_text("Traceback ...\nRuntimeError: CUDA out of memory\n")
    out = tmp_path / "out"
    subprocess.run([sys.executable, "scripts/analysis/suite_report.py", str(out), str(tmp_path / "call")],
                   cwd=ROOT, check=True, capture_output=True, text=True)
    md = (out / "inspect.md").read_text()
    assert "2/3 problems inspected" in md
    row = next(l for l in md.splitlines() if l.startswith("| 002_gemm"))
    assert row.endswith("| 1.0071 (10) |") and row.count("|") == 11  # a report from before the plan
    assert next(l for l in md.splitlines() if l.startswith("| 016_silu")).endswith("| 1.0071 (7×480) |")
    assert "| 009_lstm_unrolled_bf16 | failed: RuntimeError: CUDA out of memory |" in md
    rows = {r["problem"]: r for r in json.loads((out / "summary.json").read_text())["inspect"]["default"]}
    assert rows["016_silu_bf16"]["rounds"] == 7 and rows["002_gemm_bias_gelu_bf16"]["noise_floor"] == 1.0071
