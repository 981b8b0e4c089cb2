"""scripts/analysis/backfill_result_files.py: the result files of decisions recorded before the
decisions file carried them, filled in only where they hash to the entry's ``result_hash`` (from
a campaign's output folder, or made again from the report's measurement by the result module)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

from scriptload import analysis_script

REPO = Path(__file__).resolve().parents[2]
VECTOR_ADD = "tests/candidates/problems/vector_add.py"


def module() -> Any:
    return analysis_script("backfill_result_files")


def entry(problem: str, result_hash: Any, measurement: Any = None, agent: str = "dispatch") -> Dict[str, Any]:
    return {"decided_unix_s": 1, "machine": "NVIDIA H100 80GB HBM3, torch 2.11.0+cu130", "source_hash": "s",
            "result_hash": result_hash,
            "report": {"problem": problem, "decision": {"kind": "improved", "agent": agent}, "measurement": measurement}}


def folder(out: Path, level: str, stem: str, text: str) -> str:
    f = out / level / stem
    f.mkdir(parents=True)
    (f / "model_new.py").write_text(text)
    (f / "policy.toml").write_text('torch_policy = "reference-ops"\n')
    return str(module().files_hash(str(f)))


def test_files_are_taken_from_an_output_folder_only_as_decided(tmp_path: Path) -> None:
    m = module()
    out = tmp_path / "out"
    a = folder(out, "level1", "a", "# a\n")
    folder(out, "level1", "b", "# b, made again since\n")
    d = {"decisions": 1, "entries": [entry("p/level1/a.py", a), entry("p/level1/b.py", "the decided file's hash"),
                                     entry("p/level1/c.py", None)]}
    path = tmp_path / "decisions.json"
    path.write_text(json.dumps(d))
    assert m.main([str(path), str(out), "--check"]) == 0
    assert json.loads(path.read_text()) == d, "--check writes nothing"
    assert m.main([str(path), str(out)]) == 0
    back = json.loads(path.read_text())
    assert back["entries"][0]["result_files"] == {"model_new.py": "# a\n", "policy.toml": 'torch_policy = "reference-ops"\n'}
    assert "result_files" not in back["entries"][1], "another file than the decided one"
    assert "result_files" not in back["entries"][2], "it wrote none"
    assert m.main([str(path), str(tmp_path / "missing")]) == 2


def test_a_dispatch_result_is_made_again_and_kept_only_when_it_hashes_as_decided(tmp_path: Path) -> None:
    m = module()
    measurement = {"baseline": "default", "winner": "eager", "fallback": False,
                   "modes": {"eager": {"speedup": 1.5, "ci95": [1.4, 1.6], "beyond_noise": True}}}
    # What kforge's result step wrote when it decided (the versions from its measurement).
    made = tmp_path / "made"
    (tmp_path / "m.json").write_text(json.dumps({**measurement, "versions": {"torch": "2.11.0+cu130", "triton": "3.6.0"}}))
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    subprocess.run([sys.executable, "-m", "kforge.optimize.result", VECTOR_ADD, str(tmp_path / "m.json"), "--out",
                    str(made)], env=env, check=True, cwd=REPO, timeout=300)
    decided = str(m.files_hash(str(made)))
    d = {"decisions": 1, "entries": [entry(VECTOR_ADD, decided, measurement), entry(VECTOR_ADD, "other", measurement),
                                     entry(VECTOR_ADD, decided, measurement, agent="config")]}
    path = tmp_path / "decisions.json"
    path.write_text(json.dumps(d))
    cwd = os.getcwd()
    os.chdir(REPO)  # the report's problem path is relative to where the campaign ran
    try:
        assert m.main([str(path), "--regenerate", "--triton", "3.6.0"]) == 0
    finally:
        os.chdir(cwd)
    back = json.loads(path.read_text())["entries"]
    assert back[0]["result_files"]["model_new.py"] == (made / "model_new.py").read_text()
    assert "Triton 3.6.0" in back[0]["result_files"]["model_new.py"] and "torch 2.11.0+cu130" in back[0]["result_files"]["model_new.py"]
    assert "result_files" not in back[1], "made again but not as decided"
    assert "result_files" not in back[2], "the config agent's result is not the result module's"
