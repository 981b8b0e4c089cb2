"""scripts/analysis/campaign_reverify.py, issue 18's re-verification made call by call: which
result folders a call leaves out (no result file: restored from a decisions file; or verified
again already, for the same decision), and the rows kept across calls (a later row replaces an
earlier one, cut to the kept fields)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from scriptload import analysis_script

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "analysis" / "campaign_reverify.py"


def module() -> Any:
    return analysis_script("campaign_reverify")


def folder(out: Path, rel: str, result: bool, decision: Any = None) -> None:
    (out / rel).mkdir(parents=True)
    (out / rel / "report.json").write_text(json.dumps({"decision": decision or {"kind": "fallback"}}))
    if result:
        (out / rel / "model_new.py").write_text("class ModelNew: pass\n")


def test_a_result_is_verified_again_once_while_its_file_exists(tmp_path: Path) -> None:
    out = tmp_path / "out"
    improved = {"kind": "improved", "speedup": 1.5}
    folder(out, "level1/a", True, improved)  # decided, not verified again yet
    folder(out, "level1/b", True, improved)  # verified again by an earlier call, the same decision
    folder(out, "level2/c", False)           # restored from a decisions file: no result file here
    folder(out, "level2/d", True, improved)  # an earlier row, but for another decision: again
    folder(out, "level2/e", True)            # an earlier row without a verdict: again
    kept = [
        {"candidate": "level1__b", "decision": "improved", "decided_speedup": 1.5, "outcome": "accepted"},
        {"candidate": "level2__d", "decision": "fallback", "decided_speedup": None, "outcome": "rejected"},
        {"candidate": "level2__e", "decision": "fallback", "decided_speedup": None, "outcome": "could-not-run"},
    ]
    keys = module().skip_keys(str(out), kept)
    assert keys == ["verify-results/level1__b", "verify-results/level2__c"]
    kept_file = tmp_path / "kept.json"
    kept_file.write_text(json.dumps({"results": kept}))
    run = subprocess.run([sys.executable, str(SCRIPT), "skip", str(out), str(kept_file)],
                         capture_output=True, text=True, check=True)
    assert run.stdout.split() == keys and run.stderr.strip() == "3 result(s) to verify again"


def test_rows_merge_across_calls_and_print_the_agreement(tmp_path: Path) -> None:
    out = tmp_path / "out"
    folder(out, "level1/a", True, {"kind": "improved", "speedup": 1.5})
    folder(out, "level2/c", True, {"kind": "improved", "speedup": 2.0})
    kept = tmp_path / "kept.json"
    kept.write_text(json.dumps({"results": [
        {"candidate": "level1__a", "decision": "improved", "outcome": "rejected", "agrees": False},
        {"candidate": "level1__b", "decision": "fallback", "outcome": "rejected", "agrees": True},
    ]}))
    verdicts = tmp_path / "verify-results"
    verdicts.mkdir()
    perf = {"gate": "performance", "name": "speedup", "ok": True, "evidence": {"speedup": 1.49}}
    (verdicts / "level1__a.json").write_text(json.dumps({"outcome": "accepted", "rejected_by": None,
                                                         "gates": [{"checks": [perf]}], "phase_seconds": {"total": 20.0}}))
    (verdicts / "level2__c.json").write_text(json.dumps({"outcome": "could-not-run", "gates": []}))
    (verdicts / "level2__d.json").write_text('{"outcome": "acc')  # cut off: left for a later call
    out_json = tmp_path / "reverified.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "merge", str(kept), str(verdicts), str(out), str(out_json)],
                         capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "2/3 re-verified as decided"
    rows = json.loads(out_json.read_text())["results"]
    assert [r["candidate"] for r in rows] == ["level1__a", "level1__b", "level2__c"]
    assert rows[0] == {"candidate": "level1__a", "decision": "improved", "decided_speedup": 1.5, "outcome": "accepted",
                       "rejected_by": None, "speedup": 1.49, "seconds": 20.0, "agrees": True}
    assert rows[2]["agrees"] is False and rows[2]["decided_speedup"] == 2.0
    assert len(out_json.read_text().splitlines()) == 5, "one row a line"
    # A first call without verdicts (nothing to verify, or no time): the kept rows, none here.
    run = subprocess.run([sys.executable, str(SCRIPT), "merge", str(tmp_path / "none.json"), str(tmp_path / "no-dir"),
                          str(out), str(out_json)], capture_output=True, text=True, check=True)
    assert json.loads(out_json.read_text()) == {"results": []} and run.stdout.strip() == "0/0 re-verified as decided"


def test_bad_arguments_print_the_usage() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "mix"], capture_output=True, text=True)
    assert run.returncode == 2 and "campaign_reverify.py skip OUT_DIR [KEPT]" in run.stderr
