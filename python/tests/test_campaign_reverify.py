"""scripts/analysis/campaign_reverify.py, issue 18's re-verification made call by call: which
result folders a call leaves out (resumed, or restored from a decisions file without a result file), and
the rows kept across calls (a later row replaces an earlier one, cut to the kept fields)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "analysis" / "campaign_reverify.py"


def module() -> Any:
    spec = importlib.util.spec_from_file_location("campaign_reverify", SCRIPT)
    assert spec is not None and spec.loader is not None
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def folder(out: Path, rel: str, result: bool) -> None:
    (out / rel).mkdir(parents=True)
    (out / rel / "report.json").write_text("{}")
    if result:
        (out / rel / "model_new.py").write_text("class ModelNew: pass\n")


def test_only_what_this_call_decided_is_verified_again(tmp_path: Path) -> None:
    out = tmp_path / "out"
    folder(out, "level1/a", True)   # decided in this call
    folder(out, "level1/b", True)   # resumed from the journal: verified by the call that decided it
    folder(out, "level2/c", False)  # restored from a decisions file: no result file here
    folder(out, "level2/d", True)   # failed in this call (no decision), a report of an older run
    campaign = {"problems": [
        {"problem": "level1/a.py", "decision": {"kind": "improved"}, "resumed": False},
        {"problem": "level1/b.py", "decision": {"kind": "fallback"}, "resumed": True},
        {"problem": "level2/c.py", "decision": {"kind": "improved"}, "resumed": True},
        {"problem": "level2/d.py", "decision": None, "error": "boom", "resumed": False},
    ]}
    keys = module().skip_keys(campaign, str(out))
    assert keys == ["verify-results/level1__b", "verify-results/level2__c", "verify-results/level2__d"]


def test_rows_merge_across_calls_and_print_the_agreement(tmp_path: Path) -> None:
    kept = tmp_path / "kept.json"
    kept.write_text(json.dumps({"results": [
        {"candidate": "level1__a", "decision": "improved", "outcome": "rejected", "agrees": False},
        {"candidate": "level1__b", "decision": "fallback", "outcome": "rejected", "agrees": True},
    ]}))
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"verify-results": [
        {"candidate": "level1__a", "decision": "improved", "decided_speedup": 1.5, "outcome": "accepted",
         "rejected_by": None, "speedup": 1.49, "seconds": 20.0, "agrees": True, "phase_seconds": {"x": 1}},
        {"candidate": "level2__c", "decision": "improved", "decided_speedup": 2.0, "outcome": "could-not-run",
         "rejected_by": None, "speedup": None, "seconds": 3.0, "agrees": False},
    ]}))
    out = tmp_path / "reverified.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "merge", str(kept), str(summary), str(out)],
                         capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "2/3 re-verified as decided"
    rows = json.loads(out.read_text())["results"]
    assert [r["candidate"] for r in rows] == ["level1__a", "level1__b", "level2__c"]
    assert rows[0]["outcome"] == "accepted" and "phase_seconds" not in rows[0], "replaced, cut to the kept fields"
    assert len(out.read_text().splitlines()) == 5, "one row a line"
    # A first call: no kept file yet, no summary (nothing decided): an empty list.
    run = subprocess.run([sys.executable, str(SCRIPT), "merge", str(tmp_path / "none.json"),
                          str(tmp_path / "none-summary.json"), str(out)], capture_output=True, text=True, check=True)
    assert json.loads(out.read_text()) == {"results": []} and run.stdout.strip() == "0/0 re-verified as decided"


def test_bad_arguments_print_the_usage() -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "mix"], capture_output=True, text=True)
    assert run.returncode == 2 and "campaign_reverify.py skip CAMPAIGN_JSON OUT_DIR" in run.stderr
