"""scripts/analysis/backfill_confirmed.py: gate 4's speedup filled into decisions made before
reports recorded it, only where the folder still holds the decided result file (its hash the
entry's, computed as kforge does), the file rewritten in kforge's layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

from scriptload import analysis_script


def module() -> Any:
    return analysis_script("backfill_confirmed")


def test_the_hash_is_kforges() -> None:
    m = module()  # the same values are pinned in kforge-optimize's journal tests
    assert m.content_hash([]) == "cbf29ce484222325"
    assert m.content_hash([b"model_new.py", b"a", b"policy.toml", b"b"]) == "928b427e3a580832"


def entry(problem: str, decision: Dict[str, Any], result_hash: Any, **report: Any) -> Dict[str, Any]:
    return {"decided_unix_s": 1, "machine": "gpu", "source_hash": "s", "result_hash": result_hash,
            "report": {"problem": problem, "decision": decision, **report}}


def result(out: Path, level: str, stem: str, speedup: Any) -> str:
    folder = out / level / stem
    folder.mkdir(parents=True)
    (folder / "model_new.py").write_text(f"# {stem}\n")
    (folder / "policy.toml").write_text("torch = 'dispatch-aware'\n")
    check = {"gate": "performance", "name": "speedup", "evidence": {"speedup": speedup}}
    (folder / "verdict.json").write_text(json.dumps({"gates": [{"checks": [{"gate": "static", "name": "x"}, check]}]}))
    return str(module().files_hash(str(folder)))


def test_only_a_folder_holding_the_decided_file_fills_it(tmp_path: Path) -> None:
    m = module()
    out = tmp_path / "out"
    won = {"kind": "improved", "agent": "dispatch", "mode": "eager", "speedup": 2.0}
    a = result(out, "level1", "a", 1.5)
    b = result(out, "level1", "b", 1.25)
    result(out, "level1", "c", "nan")
    d = {"decisions": 1, "entries": [
        entry("problems/level1/a.py", won, a),
        entry("problems/level1/b.py", won, "another file's hash"),
        entry("problems/level1/c.py", won, module().files_hash(str(out / "level1" / "c"))),
        entry("problems/level1/d.py", {"kind": "fallback", "reason": "r"}, None),
        entry("problems/level1/e.py", {**won, "agent": "config"}, b),
        entry("problems/level1/f.py", won, a, confirmed=1.1),
    ]}
    path = tmp_path / "decisions.json"
    path.write_text(json.dumps(d))
    assert m.main([str(path), str(out), "--check"]) == 0
    assert json.loads(path.read_text()) == d, "--check writes nothing"
    assert m.main([str(path), str(out)]) == 0
    text = path.read_text()
    assert text.startswith('{"decisions": 1,\n"entries": [\n') and text.endswith("\n]}\n")
    assert len(text.splitlines()) == 2 + 6 + 1, "one entry a line"
    got = [e["report"].get("confirmed") for e in json.loads(text)["entries"]]
    assert got == [1.5, None, None, None, None, 1.1]


def test_not_a_folder_is_named(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "decisions.json"
    path.write_text(json.dumps({"decisions": 1, "entries": []}))
    assert module().main([str(path), str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def test_the_rewritten_file_keeps_its_carried_steps(tmp_path: Path) -> None:
    """The undecided problems' finished steps (kforge's ``"steps"``, one a line after the floors)
    survive the rewrite, with their output files' text."""
    m = module()
    path = str(tmp_path / "decisions.json")
    step = {"machine": "gpu", "question": {"problem": "level3/a.py"}, "step": "measure", "input_hash": "h",
            "output": "level3/a/dispatch.json", "output_hash": "o", "text": "{\"modes\": {}}\n", "seconds": 348.8}
    d = {"decisions": 1, "entries": [], "floors": [{"step": "measure", "seconds": 1.0}], "steps": [step]}
    m.write(path, d)
    text = Path(path).read_text()
    assert json.loads(text) == d and text.endswith('"steps": [\n' + json.dumps(step, separators=(",", ":")) + "\n]}\n")


def test_the_rewritten_file_keeps_its_step_floors(tmp_path: Path) -> None:
    """A decisions file's undecided problems' step floors (kforge's ``"floors"``, one a line after
    the entries) survive the rewrite; a file without them gets none."""
    m = module()
    path = str(tmp_path / "decisions.json")
    floor = {"machine": "gpu", "question": {"problem": "level3/a.py"}, "step": "measure", "seconds": 462.3}
    d = {"decisions": 1, "entries": [entry("level1/a.py", {"fallback": {"reason": "r"}}, None)], "floors": [floor]}
    m.write(path, d)
    text = Path(path).read_text()
    assert json.loads(text) == d and text.endswith('"floors": [\n' + json.dumps(floor, separators=(",", ":")) + "\n]}\n")
    del d["floors"]
    m.write(path, d)
    assert "floors" not in Path(path).read_text() and json.loads(Path(path).read_text()) == d
