"""The dispatch winner's result file: a standalone ModelNew module (torch alone) with the
reference's weights by name, equal outputs in a fresh interpreter, and its inputs refused
clearly. Its verification under the policy beside it is crates/kforge/tests/verify.rs's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
pytest.importorskip("torch")

from kforge.optimize import result  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SOFTMAX = REPO / "tests" / "candidates" / "problems" / "row_softmax.py"
LINEAR = '''import torch
import torch.nn as nn

N = 16


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.proj = nn.Linear(n, n)

    def forward(self, x):
        return torch.relu(self.proj(x))


def get_inputs():
    return [torch.randn(4, N)]


def get_init_inputs():
    return [N]
'''

CHECK = '''
import importlib.util, sys, torch
def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
problem, cand = load(sys.argv[1], "problem"), load(sys.argv[2], "candidate")
assert "kforge" not in sys.modules, "the result imported kforge"
torch.manual_seed(0)
ref = problem.Model(*problem.get_init_inputs()).eval()
new = cand.ModelNew(*problem.get_init_inputs()).eval()
new.load_state_dict(ref.state_dict())  # strict: the same parameter names
xs = problem.get_inputs()
with torch.no_grad():
    a, b = ref(*xs), new(*xs)
    b2 = new(*xs)  # the compiled forward, called again
print(float((a - b).abs().max()), float((a - b2).abs().max()))
'''


def measured(winner: str, speedup: float = 1.3) -> dict:  # type: ignore[type-arg]
    return {"winner": winner, "baseline": "default", "modes": {winner: {"speedup": speedup}},
            "versions": {"torch": "2.x", "triton": "3.x"}}


@pytest.mark.parametrize("mode", ["eager", "default", "default+aggressive-fusion"])
def test_the_result_runs_standalone_with_the_references_weights(tmp_path: Path, mode: str) -> None:
    problem = tmp_path / "linear.py"
    problem.write_text(LINEAR)
    model_path, policy_path = result.write_result(str(problem), measured(mode), str(tmp_path / "out"))
    text = Path(model_path).read_text()
    assert "class Reference(nn.Module)" in text and "class ModelNew(Reference)" in text and "class Model(" not in text
    assert ("torch.compile" in text) is (mode != "eager") and "measured speedup 1.300x" in text
    assert ("options={'aggressive_fusion': True}" in text) is (mode == "default+aggressive-fusion"), text
    assert Path(policy_path).read_text() == 'torch_policy = "reference-ops"\nbaseline_mode = "default"\n'
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    out = subprocess.run([sys.executable, str(script), str(problem), model_path], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    d1, d2 = (float(x) for x in out.stdout.split())
    assert d1 <= 1e-5 and d2 <= 1e-5, out.stdout


def test_the_policy_names_a_compiled_baseline_only() -> None:
    assert result.policy_text({"baseline": "max-autotune"}) == 'torch_policy = "reference-ops"\nbaseline_mode = "max-autotune"\n'
    assert result.policy_text({"baseline": "eager"}) == 'torch_policy = "reference-ops"\n'


def test_a_kept_baseline_says_so() -> None:
    text = result.model_new_source(str(SOFTMAX), SOFTMAX.read_text(), "default", {"winner": "default", "baseline": "default"})
    assert "none (the baseline kept)" in text


def test_bad_inputs_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for source, why in (("def f(:\n", "does not parse"), ("class Other:\n    pass\n", "no class Model"),
                        ("class Model:\n    pass\nReference = 1\n", "already uses the name Reference")):
        with pytest.raises(result.ResultError, match=why):
            result.renamed_reference(source, "p.py")
    for bad in ("fast", "default+turbo", "eager+freezing"):
        with pytest.raises(result.ResultError, match=re.escape(f"unknown mode {bad!r}")):
            result.model_new_source("p.py", LINEAR, bad, {})
    m = tmp_path / "m.json"
    m.write_text(json.dumps({"baseline": "default"}))
    assert result.main([str(SOFTMAX), str(m), "--out", str(tmp_path / "o")]) == 2
    assert "names no winner" in capsys.readouterr().err
    m.write_text("{not json")
    assert result.main([str(SOFTMAX), str(m), "--out", str(tmp_path / "o")]) == 2
    assert "not a readable dispatch result" in capsys.readouterr().err
    m.write_text(json.dumps(measured("eager")))
    assert result.main([str(tmp_path / "missing.py"), str(m), "--out", str(tmp_path / "o")]) == 2
    assert "missing.py" in capsys.readouterr().err
