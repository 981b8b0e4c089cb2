"""The dispatch winner's result file: a standalone ModelNew module (torch alone) with the
reference's weights by name, equal outputs in a fresh interpreter, and its inputs refused
clearly. Its verification under the policy beside it is crates/kforge/tests/verify.rs's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
pytest.importorskip("torch")

from kforge.optimize import dispatch, result  # noqa: E402

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


@pytest.mark.parametrize("mode", ["eager", "default", "default+aggressive-fusion", "default+aggressive-fusion+freezing"])
def test_the_result_runs_standalone_with_the_references_weights(tmp_path: Path, mode: str) -> None:
    problem = tmp_path / "linear.py"
    problem.write_text(LINEAR)
    model_path, policy_path = result.write_result(str(problem), measured(mode), str(tmp_path / "out"))
    text = Path(model_path).read_text()
    assert "class Reference(nn.Module)" in text and "class ModelNew(Reference)" in text and "class Model(" not in text
    assert ("torch.compile" in text) is (mode != "eager") and "measured speedup 1.300x" in text
    assert ("options={'aggressive_fusion': True}" in text) is (mode == "default+aggressive-fusion"), text
    assert ("'aggressive_fusion': True, 'freezing': True}" in text) is mode.endswith("+freezing"), text
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
    for bad in ("fast", "default+turbo", "eager+freezing", "default+freezing+turbo"):
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
    for argv in ([str(SOFTMAX)], [str(SOFTMAX), str(m), "--eager"]):
        assert result.main(argv + ["--out", str(tmp_path / "o")]) == 2
        assert "name a dispatch result or --eager" in capsys.readouterr().err


def test_eager_is_the_references_forward_verified_against_default_mode(tmp_path: Path) -> None:
    """--eager: the result file of "eager" without a measurement (the suite runs verify every
    problem with it), the same files as a measured eager winner against default mode."""
    assert result.main([str(SOFTMAX), "--eager", "--out", str(tmp_path / "e")]) == 0
    measured_dir = tmp_path / "m"
    result.write_result(str(SOFTMAX), {"winner": "eager", "baseline": "default", "modes": {}}, str(measured_dir))
    for name in ("model_new.py", "policy.toml"):
        assert (tmp_path / "e" / name).read_text() == (measured_dir / name).read_text()
    assert 'baseline_mode = "default"' in (tmp_path / "e" / "policy.toml").read_text()


DIAG_SCALE = REPO / "tests" / "candidates" / "problems" / "diag_scale.py"
KFORGE = Path(os.environ.get("KFORGE_BIN", REPO / "target" / "debug" / "kforge"))


def rewrite_measured(tmp_path: Path) -> dict:  # type: ignore[type-arg]
    """The dispatch step with the rewrite agent on diag_scale.py: diag-matmul fires."""
    out = tmp_path / "d.json"
    with warnings.catch_warnings():  # no daemon: regions are not exclusive
        warnings.simplefilter("ignore")
        assert dispatch.main([str(DIAG_SCALE), "--out", str(out), "--device", "cpu", "--modes", "eager",
                              "--baseline", "default", "--rewrite", "exact,reassociates", "--rounds", "2"]) == 0
    m: dict = json.loads(out.read_text())  # type: ignore[type-arg]
    assert m["rewrite"]["fired"], m["rewrite"]
    return m


def verify(candidate: Path, policy: Path, out: Path, problem: Path = DIAG_SCALE) -> dict:  # type: ignore[type-arg]
    """``kforge verify`` (the real binary) on the CPU, without gate 4: the verdict."""
    assert KFORGE.is_file(), f"{KFORGE}: build the binary first (cargo build -p kforge) or set KFORGE_BIN"
    done = subprocess.run([str(KFORGE), "verify", str(problem), str(candidate), "--policy", str(policy),
                           "--device", "cpu", "--no-performance", "--json", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KFORGE_SOCKET": str(out.with_suffix(".no-daemon.sock"))})
    assert out.is_file(), done.stdout[-2000:] + done.stderr[-2000:]
    v: dict = json.loads(out.read_text())  # type: ignore[type-arg]
    return v


def dispatch_check(v: dict, name: str) -> dict:  # type: ignore[type-arg]
    return next(c for g in v["gates"] for c in g["checks"] if c["name"] == name)


@pytest.mark.parametrize("winner", ["eager~rewrite", "default~rewrite"])
def test_a_rewrite_winner_is_a_standalone_file_that_verify_accepts(tmp_path: Path, winner: str) -> None:
    """The rewritten forward as a standalone ModelNew (torch alone, equal to the reference in a
    fresh interpreter) whose policy allows the reference's ops plus exactly the ops the rewrite
    introduced: kforge verify passes it; ghost-replay and kernels-ran do not apply (no kernel of
    its own), as for a dispatch result."""
    m = {**rewrite_measured(tmp_path), "winner": winner}
    model_path, policy_path = result.write_result(str(DIAG_SCALE), m, str(tmp_path / "out"))
    text = Path(model_path).read_text()
    assert "(agent rewrite)" in text and "diag-matmul (exact)" in text and "import kforge" not in text, text
    assert "torch.diag" not in text and "unsqueeze * b" in text, text
    assert ("class ModelNew(Rewritten)" in text and "mode='default'" in text) is (winner == "default~rewrite"), text
    policy = Path(policy_path).read_text()
    assert 'allowed_aten_ops = ["mul", "unsqueeze"]' in policy and "flops = 0" in policy, policy
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    out = subprocess.run([sys.executable, str(script), str(DIAG_SCALE), model_path], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert [float(x) for x in out.stdout.split()] == [0.0, 0.0], out.stdout  # exact
    v = verify(Path(model_path), Path(policy_path), tmp_path / "v.json")
    assert (v["outcome"], v["torch_policy"]) == ("passed-without-performance", "reference-ops"), v["rejected_by"]
    assert dispatch_check(v, "torch-compute")["evidence"]["policy_allowed_ops"] == {"mul": 25}
    assert dispatch_check(v, "ghost-replay")["ok"] is None and dispatch_check(v, "kernels-ran")["ok"] is None


def test_verify_rejects_an_op_the_rewrite_did_not_introduce(tmp_path: Path) -> None:
    """The rewrite's policy allows mul, not anything: a hand-made variant that computes the same
    with addcmul is torch compute; and the rewrite itself under reference-ops alone is too (its
    mul is not the reference's)."""
    m = {**rewrite_measured(tmp_path), "winner": "eager~rewrite"}
    model_path, policy_path = result.write_result(str(DIAG_SCALE), m, str(tmp_path / "out"))
    text = Path(model_path).read_text()
    hand = tmp_path / "hand.py"
    hand.write_text(text.replace("unsqueeze * b", "torch.addcmul(torch.zeros_like(b), unsqueeze, b)"))
    assert hand.read_text() != text
    v = verify(hand, Path(policy_path), tmp_path / "v1.json")
    assert (v["outcome"], v["rejected_by"]) == ("rejected", "dispatch:torch-compute"), v["rejected_by"]
    assert set(dispatch_check(v, "torch-compute")["evidence"]["compute_ops"]) == {"addcmul"}
    plain = tmp_path / "plain.toml"
    plain.write_text('torch_policy = "reference-ops"\n')
    v = verify(Path(model_path), plain, tmp_path / "v2.json")
    assert (v["outcome"], v["rejected_by"]) == ("rejected", "dispatch:torch-compute"), v["rejected_by"]
    assert set(dispatch_check(v, "torch-compute")["evidence"]["compute_ops"]) == {"mul"}


def test_a_rewrite_result_is_the_measured_forward_or_refused(tmp_path: Path) -> None:
    m = {**rewrite_measured(tmp_path), "winner": "eager~rewrite"}
    with pytest.raises(result.ResultError, match="not the one measured"):
        result.write_result(str(DIAG_SCALE), {**m, "rewrite": {**m["rewrite"], "key": "0" * 64}}, str(tmp_path / "o"))
    with pytest.raises(result.ResultError, match="records no rewrite that fired"):
        result.write_result(str(DIAG_SCALE), {**m, "rewrite": None}, str(tmp_path / "o"))
    with pytest.raises(result.ResultError, match="unknown mode 'turbo'"):
        result.model_new_source(str(DIAG_SCALE), DIAG_SCALE.read_text(), "turbo~rewrite", m)


GRAPH_BREAK = REPO / "python" / "tests" / "fixtures" / "graphs" / "linear_hook_softmax.py"


def test_a_per_graph_winner_is_a_standalone_file_that_verify_accepts(tmp_path: Path) -> None:
    """``graphs:eager/default``: the reference as it is, its first graph run eagerly and its second
    compiled by the per-graph backend whose text was measured (``ROUTED_BACKEND``), the breaks
    named in the header; equal to the reference in a fresh interpreter without kforge, and
    accepted by kforge verify under reference-ops."""
    m = {**measured("graphs:eager/default"),
         "graphs": {"count": 2, "breaks": ["Skip calling `torch.compiler.disable()`d function (linear_hook_softmax.py:24)",
                                           'a reason quoting """ and \\N{oops}']}}
    model_path, policy_path = result.write_result(str(GRAPH_BREAK), m, str(tmp_path / "out"))
    text = Path(model_path).read_text()
    assert "(agent dispatch, per graph)" in text and "graph 0 eager, graph 1 default" in text, text
    assert "# Graph break 1: Skip calling" in text and "PLAN = ['eager', 'default']" in text, text
    assert '# Graph break 2: a reason quoting """' in text, "a reason that would break a docstring is a comment"
    assert dispatch.ROUTED_BACKEND in text and "import kforge" not in text
    assert Path(policy_path).read_text() == 'torch_policy = "reference-ops"\nbaseline_mode = "default"\n'
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    out = subprocess.run([sys.executable, str(script), str(GRAPH_BREAK), model_path], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert all(float(x) <= 1e-5 for x in out.stdout.split()), out.stdout
    v = verify(Path(model_path), Path(policy_path), tmp_path / "v.json", GRAPH_BREAK)
    assert (v["outcome"], v["torch_policy"]) == ("passed-without-performance", "reference-ops"), v["rejected_by"]
    with pytest.raises(result.ResultError, match="'turbo' is not a mode"):
        result.model_new_source(str(GRAPH_BREAK), GRAPH_BREAK.read_text(), "graphs:eager/turbo", m)


def test_the_reference_keeps_the_problems_formatting_and_comments() -> None:
    """The rename is made where the names stand (comments, blank lines and spelling kept, so the
    report's diff shows what changed); an attribute named Model is not the class; where the
    in-place rename is not the tree's rename (a keyword argument named Model), the renamed tree
    is unparsed instead."""
    src = ('"""doc"""\nimport torch.nn as nn\nROWS, COLS = 64, 256  # shape\n\n\n'
           'class Model(nn.Module):\n    def forward(self, x):\n        return Model.f(x) if x.Model else x\n')
    out = result.renamed_reference(src, "p.py")
    assert out == src.replace("class Model(", "class Reference(").replace("return Model.f", "return Reference.f").rstrip(), out
    fallback = result.renamed_reference("class Model:\n    pass\nf(Model=1)  # kw\n", "q.py")
    assert fallback == "class Reference:\n    pass\nf(Model=1)", fallback
