"""scripts/analysis/roofline_table.py: the config agent's roofline beside what its search found."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import pytest
from scriptload import analysis_script


def result(problem: str, rows: Dict[str, Dict[str, Any]], kernels: Dict[str, Dict[str, Any]],
           skipped: Dict[str, str]) -> Dict[str, Any]:
    return {"agent": "config", "problem": f"problems/level1/{problem}.py", "kernels": kernels, "skipped": skipped,
            "roofline": {"peak_bytes_per_s": 2.9e12, "skip_at": 1.02, "kernels": rows}}


def test_each_kernels_roofline_is_set_beside_what_its_search_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rt = analysis_script("roofline_table")
    silu = result("016_silu_bf16",
                  {"triton_poi_fused_silu_0": {"kind": "pointwise", "bytes": 6.4e9, "us_per_launch": 2300.0,
                                               "of_peak": 1.03, "ceiling": 1.019}},
                  {"triton_poi_fused_silu_0": {"fallback": False, "speedup": 1.012}}, {})
    norm = result("010_rmsnorm_bf16",
                  {"triton_red_fused_a_0": {"kind": "reduction", "bytes": 3.2e9, "us_per_launch": 1600.0,
                                            "of_peak": 0.70, "ceiling": 1.43},
                   "triton_poi_fused_b_1": {"kind": "pointwise", "bytes": 1e6, "us_per_launch": 2.0,
                                            "of_peak": 0.2, "why": "its traffic (1.0 MB a launch) is within 4x the L2"},
                   "triton_red_fused_c_2": {"kind": "reduction", "bytes": 3.2e9, "of_peak": 1.04, "ceiling": 1.01}},
                  {"triton_red_fused_a_0": {"fallback": False, "speedup": 1.2},
                   "triton_poi_fused_b_1": {"fallback": True, "error": "ConfigError: x"}},
                  {"triton_red_fused_c_2": "at its bandwidth roof: its least traffic ..."})
    paths = []
    for name, r in (("a.json", silu), ("b.json", norm), ("c.json", {"agent": "dispatch"})):
        (tmp_path / name).write_text(json.dumps(r))
        paths.append(str(tmp_path / name))
    out = tmp_path / "t.json"
    assert rt.main(paths + ["--json", str(out)]) == 0
    data = json.loads(out.read_text())
    found = {(r["problem"], r["kernel"]): (r["found"], r["speedup"]) for r in data["rows"]}
    assert found == {("016_silu_bf16", "triton_poi_fused_silu_0"): ("won", 1.012),
                     ("010_rmsnorm_bf16", "triton_red_fused_a_0"): ("won", 1.2),
                     ("010_rmsnorm_bf16", "triton_poi_fused_b_1"): ("failed", None),
                     ("010_rmsnorm_bf16", "triton_red_fused_c_2"): ("skipped: at its bandwidth roof: its least traffic ...", None)}
    v = data["verdict"]
    assert (v["searched_with_roofline"], v["at_or_above_skip"]) == (2, 1)  # the failed one and the skipped one are not counted
    assert v["won_above_skip"] == ["016_silu_bf16:triton_poi_fused_silu_0 1.012x"] and v["best_speedup_above_skip"] == 1.012
    t = capsys.readouterr().out
    assert "1.030   1.019  won 1.012x" in t and "within 4x the L2" in t and "of those won: 1" in t
    (tmp_path / "bad.json").write_text("{")
    assert rt.main([str(tmp_path / "bad.json")]) == 2
    assert "bad.json" in capsys.readouterr().err
