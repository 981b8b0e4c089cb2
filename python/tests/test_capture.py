"""kforge.capture without a GPU: input classification, clear errors, wrapper and trace helpers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from kforge import capture

FIXTURES = Path(__file__).resolve().parents[2] / "crates" / "kforge-inductor" / "tests" / "fixtures"


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_problem_and_triton_files_are_told_apart(tmp_path: Path) -> None:
    prob = write(tmp_path, "p.py", "class Model:\n    pass\ndef get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n")
    kind, mod = capture.load_source(prob)
    assert kind == "problem" and mod.get_inputs() == []
    tri = write(tmp_path, "k.py", "def kernel_function(*a):\n    return a\ndef get_inputs():\n    return [1]\n")
    assert capture.load_source(tri)[0] == "triton"


@pytest.mark.parametrize(
    "text, message",
    [
        ("def get_init_inputs():\n    return []\n", "no get_inputs()"),
        ("class Model:\n    pass\ndef get_inputs():\n    return []\n", "no get_init_inputs()"),
        ("def get_inputs():\n    return []\n", "neither a problem"),
        ("import no_such_module_kforge\n", "importing it failed: ModuleNotFoundError"),
        ("def f(:\n", "syntax error at line 1"),
        ("raise RuntimeError('boom')\n", "RuntimeError: boom"),
    ],
)
def test_bad_input_names_file_and_cause(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, "bad.py", text)
    with pytest.raises(capture.CaptureError) as e:
        capture.load_source(path)
    assert str(e.value).startswith(path) and message in str(e.value)


def test_missing_file_and_main_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nope.py")
    with pytest.raises(capture.CaptureError, match="no such file"):
        capture.load_source(missing)
    out = tmp_path / "c.json"
    assert capture.main([missing, "--out", str(out)]) == 2
    assert "nope.py: no such file" in capsys.readouterr().err
    assert not out.exists()
    assert capture.main([missing, "--out", str(out), "--iterations", "0"]) == 2


def test_kernel_sources_of_a_real_wrapper() -> None:
    src = capture.kernel_sources((FIXTURES / "mlp_softmax_t210.py").read_text())
    assert sorted(src) == ["triton_per_fused__softmax_1", "triton_poi_fused_addmm_relu_0"]
    assert "def triton_poi_fused_addmm_relu_0(" in src["triton_poi_fused_addmm_relu_0"]
    assert "@triton.jit" in src["triton_per_fused__softmax_1"]


def ev(cat: str, name: str, ts: float, dur: float) -> Dict[str, Any]:
    return {"cat": cat, "name": name, "ts": ts, "dur": dur}


def test_iterations_grouped_by_gpu_annotations() -> None:
    events: List[Dict[str, Any]] = [
        ev("gpu_user_annotation", "kforge_iter_1", 100, 50),
        ev("gpu_user_annotation", "kforge_iter_0", 0, 50),
        ev("kernel", "b", 20, 5),
        ev("kernel", "a", 10, 5),
        ev("kernel", "c", 110, 5),
        ev("cpu_op", "aten::mm", 0, 1),
    ]
    it = capture.group_iterations(events, 2)
    assert [[k["name"] for k in i] for i in it] == [["a", "b"], ["c"]]
    assert it[0][0]["dur_us"] == 5.0


def test_iterations_split_evenly_without_annotations() -> None:
    events = [ev("kernel", f"k{i % 2}", i, 1) for i in range(6)]
    assert [[k["name"] for k in i] for i in capture.group_iterations(events, 3)] == [["k0", "k1"]] * 3
    # Not divisible: one group with everything, never a silent mis-split.
    assert len(capture.group_iterations(events, 4)) == 1
    assert capture.group_iterations([], 2) == []
    json.dumps(capture.group_iterations(events, 3))


def test_finite_json_replaces_non_finite_floats() -> None:
    from kforge.verify_runner import finite_json

    data = {"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5], "c": {"d": (2, float("nan"))}}
    out = finite_json(data)
    assert out == {"a": "nan", "b": ["inf", "-inf", 1.5], "c": {"d": ["nan"][:0] + [2, "nan"]}}
    json.dumps(out, allow_nan=False)


def test_fixture_kernels_replay_in_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-kernel replay without a GPU: Inductor kernels from a wrapper fixture, stripped of their
    autotuning decorator, run by Triton's interpreter on CPU tensors and match torch."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    pytest.importorskip("numpy")
    src = capture.kernel_sources((FIXTURES / "mlp_softmax_t210.py").read_text())

    relu = capture.kernel_for_interpreter(src["triton_poi_fused_addmm_relu_0"], "triton_poi_fused_addmm_relu_0")
    torch.manual_seed(0)
    buf, bias = torch.randn(16, 4096), torch.randn(4096)
    want = torch.relu(buf + bias)
    relu[(65536 // 1024,)](buf, bias, 65536, XBLOCK=1024)  # in_out_ptr0: updated in place
    assert torch.allclose(buf, want)

    softmax = capture.kernel_for_interpreter(src["triton_per_fused__softmax_1"], "triton_per_fused__softmax_1")
    x, out = torch.randn(16, 1024), torch.empty(16, 1024)
    softmax[(16 // 2,)](x, out, 16, 1024, XBLOCK=2)
    assert torch.allclose(out, torch.softmax(x, -1), atol=1e-6)

    with pytest.raises(capture.CaptureError, match="no @triton.jit function"):
        capture.kernel_for_interpreter(src["triton_per_fused__softmax_1"], "not_there")


def test_iterations_grouped_by_cpu_annotations_through_correlation() -> None:
    # Inductor's own record_function hides ours on the GPU timeline; the CPU-side ranges and the
    # launch events' correlation ids still place every kernel.
    events: List[Dict[str, Any]] = [
        {"cat": "user_annotation", "name": "kforge_iter_0", "ts": 0, "dur": 100},
        {"cat": "user_annotation", "name": "kforge_iter_1", "ts": 200, "dur": 100},
        {"cat": "gpu_user_annotation", "name": "## Call CompiledFxGraph f ##", "ts": 1000, "dur": 50},
        {"cat": "cuda_runtime", "name": "cuLaunchKernel", "ts": 10, "dur": 2, "args": {"correlation": 7}},
        {"cat": "cuda_runtime", "name": "cuLaunchKernel", "ts": 20, "dur": 2, "args": {"correlation": 8}},
        {"cat": "cuda_runtime", "name": "cuLaunchKernel", "ts": 210, "dur": 2, "args": {"correlation": 9}},
        {"cat": "kernel", "name": "k0", "ts": 1001, "dur": 3, "args": {"correlation": 7}},
        {"cat": "kernel", "name": "k1", "ts": 1005, "dur": 4, "args": {"correlation": 8}},
        {"cat": "kernel", "name": "k0", "ts": 1100, "dur": 3, "args": {"correlation": 9}},
    ]
    it = capture.group_iterations(events, 2)
    assert [[k["name"] for k in i] for i in it] == [["k0", "k1"], ["k0"]]


def test_wrapper_hook_catches_inductor_wrappers_of_the_installed_torch(tmp_path: Path) -> None:
    """The capture's hook on the torch installed here (CI: the current release), compiling for the
    CPU (C++ kernels; the GPU path differs only in the kernels): the wrapper module is caught,
    and its code parses into an inventory with the Rust parser (`kforge inspect --from-capture`)."""
    torch = pytest.importorskip("torch")
    import shutil
    import subprocess

    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("Inductor's CPU backend needs a C++ compiler")
    import torch._inductor.config as icfg
    from torch._inductor.utils import run_and_get_code

    icfg.fx_graph_cache = False
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU())
    x = torch.randn(4, 32)
    with capture._WrapperHook() as hook, torch.no_grad():
        out, codes = run_and_get_code(torch.compile(model), x)
    assert torch.allclose(out, model(x), atol=1e-5)
    assert len(hook.modules) == 1 and callable(hook.modules[0].call)
    assert codes and "def call" in codes[0]
    cap = tmp_path / "c.json"
    cap.write_text(json.dumps({"kforge_capture": 1, "source": "tiny", "kind": "problem", "mode": "default",
                               "wrappers": codes, "iterations": []}))
    kforge_bin = Path(__file__).resolve().parents[2] / "target" / "debug" / "kforge"
    if not kforge_bin.exists():
        pytest.skip("build the workspace first (scripts/test does)")
    rep = tmp_path / "r.json"
    r = subprocess.run([str(kforge_bin), "inspect", "--from-capture", str(cap), "--json", str(rep)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = json.loads(rep.read_text())
    ops = [launch.get("op") for launch in report["inventory"]["launches"]]
    assert "extern_kernels.addmm" in ops
