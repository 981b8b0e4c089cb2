"""kforge.inspect (the capture) without a GPU: input classification, clear errors, wrapper and trace helpers."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

import pytest

from kforge import harness
from kforge.inspect import capture, inductor, restitch, traces

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
    with pytest.raises(inductor.CaptureError) as e:
        capture.load_source(path)
    assert str(e.value).startswith(path) and message in str(e.value)


def test_missing_file_and_main_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nope.py")
    with pytest.raises(inductor.CaptureError, match="no such file"):
        capture.load_source(missing)
    out = tmp_path / "c.json"
    assert capture.main([missing, "--out", str(out)]) == 2
    assert "nope.py: no such file" in capsys.readouterr().err
    assert not out.exists()
    assert capture.main([missing, "--out", str(out), "--iterations", "0"]) == 2


def test_size_preset_is_applied_or_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.json"
    plain = write(tmp_path, "p.py", "N = 4\nclass Model:\n    pass\ndef get_inputs():\n    return []\ndef get_init_inputs():\n    return []\n")
    assert capture.main([plain, "--out", str(out), "--size", "large"]) == 2
    assert "p.py: no LARGE dict" in capsys.readouterr().err
    tri = write(tmp_path, "k.py", "def kernel_function(*a):\n    return a\ndef get_inputs():\n    return [1]\n")
    assert capture.main([tri, "--out", str(out), "--size", "large"]) == 2
    assert "k.py: --size large applies to a problem, not a Triton kernel file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        capture.main([plain, "--out", str(out), "--size", "huge"])
    assert not out.exists()


def test_kernel_sources_of_a_real_wrapper() -> None:
    src = inductor.kernel_sources((FIXTURES / "mlp_softmax_t210.py").read_text())
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
    it = traces.group_iterations(events, 2)
    assert [[k["name"] for k in i] for i in it] == [["a", "b"], ["c"]]
    assert it[0][0]["dur_us"] == 5.0


def test_iterations_split_evenly_without_annotations() -> None:
    events = [ev("kernel", f"k{i % 2}", i, 1) for i in range(6)]
    assert [[k["name"] for k in i] for i in traces.group_iterations(events, 3)] == [["k0", "k1"]] * 3
    # Not divisible: one group with everything, never a silent mis-split.
    assert len(traces.group_iterations(events, 4)) == 1
    assert traces.group_iterations([], 2) == []
    json.dumps(traces.group_iterations(events, 3))


def test_finite_json_replaces_non_finite_floats() -> None:
    data = {"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5], "c": {"d": (2, float("nan"))}}
    out = harness.finite_json(data)
    assert out == {"a": "nan", "b": ["inf", "-inf", 1.5], "c": {"d": ["nan"][:0] + [2, "nan"]}}
    json.dumps(out, allow_nan=False)


def in_a_fresh_interpreter(request: pytest.FixtureRequest) -> bool:
    """Run the calling test again in a fresh interpreter with ``TRITON_INTERPRET=1`` when triton
    was already imported without it (another test's torch.compile imported it first: its
    ``@triton.jit`` helpers are then the GPU compiler's, which the interpreter cannot call); True
    when it did (and passed there)."""
    if os.environ.get("KFORGE_TEST_FRESH") == "1" or "triton" not in sys.modules:
        return False
    env = {**os.environ, "KFORGE_TEST_FRESH": "1", "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", request.node.nodeid],
                       cwd=str(request.config.rootpath), env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "1 passed" in r.stdout, r.stdout[-2000:]
    return True


def test_fixture_kernels_replay_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Per-kernel replay without a GPU: Inductor kernels from a wrapper fixture, stripped of their
    autotuning decorator, run by Triton's interpreter on CPU tensors and match torch."""
    if in_a_fresh_interpreter(request):
        return
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    pytest.importorskip("numpy")
    src = inductor.kernel_sources((FIXTURES / "mlp_softmax_t210.py").read_text())

    relu = inductor.kernel_for_interpreter(src["triton_poi_fused_addmm_relu_0"], "triton_poi_fused_addmm_relu_0")
    torch.manual_seed(0)
    buf, bias = torch.randn(16, 4096), torch.randn(4096)
    want = torch.relu(buf + bias)
    relu[(65536 // 1024,)](buf, bias, 65536, XBLOCK=1024)  # in_out_ptr0: updated in place
    assert torch.allclose(buf, want)

    softmax = inductor.kernel_for_interpreter(src["triton_per_fused__softmax_1"], "triton_per_fused__softmax_1")
    x, out = torch.randn(16, 1024), torch.empty(16, 1024)
    softmax[(16 // 2,)](x, out, 16, 1024, XBLOCK=2)
    assert torch.allclose(out, torch.softmax(x, -1), atol=1e-6)

    with pytest.raises(inductor.CaptureError, match="no @triton.jit function"):
        inductor.kernel_for_interpreter(src["triton_per_fused__softmax_1"], "not_there")


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
    it = traces.group_iterations(events, 2)
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
    with inductor.WrapperHook() as hook, torch.no_grad():
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


def test_h200_fixture_kernels_replay_in_the_interpreter(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Kernels Inductor generated on the H200 (torch 2.11, committed captures of `kforge inspect`)
    run in Triton's interpreter on CPU tensors: a grid over the first rows/blocks only (the sizes are
    baked into the kernels), compared with torch on those."""
    if in_a_fresh_interpreter(request):
        return
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    pytest.importorskip("numpy")
    h200 = Path(__file__).resolve().parents[2] / "crates/kforge-inductor/tests/fixtures/h200"

    def sources(name: str) -> Dict[str, str]:
        cap = json.loads((h200 / f"{name}.capture.json").read_text())
        assert cap["device"].startswith("NVIDIA H200") and cap["torch"].startswith("2.11")
        out: Dict[str, str] = {}
        for w in cap["wrappers"]:
            out.update(inductor.kernel_sources(w))
        return out

    torch.manual_seed(0)
    # Kernels calling libdevice (erf, exp) do not run in the interpreter, and Inductor's helpers
    # (online softmax, Welford) change signatures between torch versions: these use neither.
    name = "triton_poi_fused__native_batch_norm_legit_no_training_relu_2"
    bn_relu = inductor.kernel_for_interpreter(sources("default_005_resnet_basic_block_fp32")[name], name)
    act = torch.randn(32, 64)  # channels-last conv output: channel = index % 64
    mean, var, weight, bias = torch.randn(64), torch.rand(64) + 0.5, torch.randn(64), torch.randn(64)
    want = torch.relu((act - mean) / torch.sqrt(var + 1e-5) * weight + bias)
    bn_relu[(2,)](act, mean, var, weight, bias, 2048, XBLOCK=1024)
    assert torch.allclose(act, want, atol=1e-5)

    name = "triton_poi_fused_addmm_relu_0"
    relu = inductor.kernel_for_interpreter(sources("default_001_gemm_bias_relu_fp32")[name], name)
    buf, bias = torch.randn(2, 4096), torch.randn(4096)
    want = torch.relu(buf + bias)
    relu[(8,)](buf, bias, 8192, XBLOCK=1024)  # in_out_ptr0: the GEMM output, updated in place
    assert torch.allclose(buf, want)


def test_identical_is_exact_up_to_nan() -> None:
    torch = pytest.importorskip("torch")
    a = torch.tensor([1.0, float("nan")])
    assert harness.identical(a, a.clone())
    assert not harness.identical(a, torch.tensor([1.0, 2.0]))
    assert not harness.identical(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 3e-7]))  # one fp32 ulp
    assert not harness.identical(torch.zeros(2), torch.zeros(2, dtype=torch.float64))
    assert harness.identical([torch.tensor([1, 2]), 3], [torch.tensor([1, 2]), 3])


def fixed_rounds(rounds: List[Tuple[List[float], List[float], List[float]]], seconds: float = 0.1) -> Any:
    """A ``time_round`` giving these rounds' samples in turn (the calls asked for recorded)."""
    it = iter(rounds)
    asked: List[int] = []

    def time_round(calls: int) -> Any:
        asked.append(calls)
        return next(it), seconds

    time_round.asked = asked  # type: ignore[attr-defined]
    return time_round


def test_interleaved_ratio_tells_a_change_from_noise() -> None:
    # Calls steady to 0.1 %, rounds apart by 0.1 % at most: the first round sizes nothing up, 5
    # rounds of its calls; new is the baseline, within noise.
    quiet = [1.0, 1.001] * 8
    moves = [(1.001, 0.999), (0.999, 1.001), (1.0005, 0.9995), (0.9995, 1.0005), (1.0, 1.0)]
    same = restitch.interleaved_ratio(fixed_rounds([(quiet, [x * f for x in quiet], [x * g for x in quiet]) for f, g in moves]))
    assert same["within_noise"] and 0.998 < same["ratio"] < 1.002 and 1.0 < same["noise_floor"] < 1.002
    assert same["plan"]["rounds"] == 5 and len(same["per_round"]) == 5
    # New is 1.5x slower every round: beyond the noise.
    slow = [x * 1.5 for x in quiet]
    beyond = restitch.interleaved_ratio(fixed_rounds([(quiet, slow, quiet)] * 5))
    assert not beyond["within_noise"] and beyond["ratio_ci95"][0] > 1.49
    r = beyond["per_round"][0]
    assert (r["calls"], r["base_ms"], r["again_over_base"]) == (16, statistics.median(quiet), 1.0)
    assert r["new_over_base"] == pytest.approx(1.5)


def test_paired_ratios_cancel_a_drift_that_the_medians_do_not() -> None:
    # Session 31's LSTM: the host slows from 3.2 to 7.3 ms halfway through a round, all sides
    # alike, with 15 calls on each side of the step: the medians land either side of it.
    base = [3.2] * 15 + [7.3] * 15
    again = [3.2] * 14 + [7.3] * 16
    assert statistics.median(again) / statistics.median(base) > 1.3
    assert harness.paired_log(base, again) == 0.0
    assert harness.pair_spread(base, base, again) > 0.1  # the step call itself


def test_a_paired_round_puts_the_others_on_the_baselines_scale_by_their_paired_ratios() -> None:
    """``harness.paired_round``, the round every gate and agent reads (verify's performance gate,
    the dispatch and config agents): the baseline's median, the others times their paired ratio,
    so the same LSTM step gives a baseline-again ratio of 1 and a 10 % slower side 1.1."""
    base = [3.2] * 15 + [7.3] * 15
    again = [3.2] * 14 + [7.3] * 16
    slower = [x * 1.1 for x in again]
    tb, ts, tb2 = harness.paired_round([base, slower, again])
    assert tb == statistics.median(base)
    assert tb2 / tb == pytest.approx(1.0) and ts / tb == pytest.approx(1.1)
    assert statistics.median(slower) / statistics.median(base) > 1.4  # what the medians said


def test_round_plan_sizes_rounds_by_the_spread_alone() -> None:
    # Calls that agree: no more than MIN_ROUNDS of the first round's calls.
    assert restitch.round_plan(15, 0.001, 0.5) == (restitch.MIN_ROUNDS, 15)
    # A host-bound 70 us call spreading by 20 % a call: more calls a round, each round under
    # ROUND_MAX_S, and the predicted floor at the aim.
    rounds, calls = restitch.round_plan(120, 0.2, 0.28)
    assert restitch.MIN_ROUNDS <= rounds <= restitch.MAX_ROUNDS and calls > 120
    assert calls * 0.28 / 120 <= restitch.ROUND_MAX_S
    t = harness.T95[min(rounds - 2, len(harness.T95) - 1)]
    assert t * harness.MEDIAN_SE * 0.2 / math.sqrt(rounds * calls) <= math.log(restitch.FLOOR_AIM)
    # A launch-bound 5 ms model whose rounds cannot hold enough calls: MAX_ROUNDS of what fits.
    rounds, calls = restitch.round_plan(15, 0.2, 1.0)
    assert (rounds, calls) == (restitch.MAX_ROUNDS, int(restitch.ROUND_MAX_S / (1.0 / 15)))


def test_rounds_that_differ_more_than_their_calls_ask_for_more_rounds() -> None:
    # Calls that agree within each round, rounds 1 % apart (base-again/base): the calls plan 5
    # rounds, the rounds' own spread asks for more, MAX_ROUNDS at most.
    quiet = [1.0] * 16
    moves = [1.01, 0.99] * restitch.MAX_ROUNDS
    time_round = fixed_rounds([(quiet, quiet, [x * g for x in quiet]) for g in moves])
    out = restitch.interleaved_ratio(time_round)
    plan = out["plan"]
    assert plan["rounds_by_calls"] == restitch.MIN_ROUNDS and plan["rounds_by_rounds"] > restitch.MAX_ROUNDS
    assert plan["rounds"] == len(out["per_round"]) == restitch.MAX_ROUNDS
    assert time_round.asked == [restitch.ROUND_MIN_CALLS] + [16] * (restitch.MAX_ROUNDS - 1)
    # Rounds 0.1 % apart: what the first MIN_ROUNDS ask for is no more than they are.
    noise = [0.0005, -0.0005, 0.0005, -0.0005, 0.0]
    assert restitch.rounds_for([0.0] * 5, noise) == restitch.MIN_ROUNDS
    s = statistics.stdev(noise)
    assert restitch.rounds_for([0.0] * 5, [10 * x for x in noise]) == math.ceil((2.776 * 10 * s / math.log(restitch.FLOOR_AIM)) ** 2)


def test_interleaved_ratio_times_the_rounds_its_first_round_plans() -> None:
    # A first round spreading by about 20 % a call: the others ask for the planned calls.
    rng = [1.0, 1.3, 0.8, 1.1, 0.9, 1.25, 0.85, 1.05] * 2
    first = (rng, rng[1:] + rng[:1], rng[2:] + rng[:2])
    steady = ([1.0] * 16, [1.0] * 16, [1.0] * 16)
    time_round = fixed_rounds([first] + [steady] * (restitch.MAX_ROUNDS - 1), seconds=0.05)
    out = restitch.interleaved_ratio(time_round)
    rounds, calls = restitch.round_plan(16, harness.pair_spread(*first), 0.05)
    assert out["plan"]["rounds"] == rounds == len(out["per_round"]) and out["plan"]["calls"] == calls > 16
    assert time_round.asked == [restitch.ROUND_MIN_CALLS] + [calls] * (rounds - 1)


def test_copy_strided_keeps_padding_strides() -> None:
    torch = pytest.importorskip("torch")
    base = torch.arange(4 * 1024, dtype=torch.float32).view(4, 1024)
    padded = base[:, :1000]  # stride (1024, 1): what Inductor passes for padded buffers
    c = capture.copy_strided(padded, "cpu")
    assert c.stride() == (1024, 1) and c.shape == (4, 1000) and torch.equal(c, padded)
    assert padded.clone().stride() == (1000, 1)  # what a clone would have handed the kernel
    assert capture.copy_strided(3, "cpu") == 3


def test_own_code_class_gets_its_own_compile() -> None:
    """Two torch.compile'd models, one of them of ``own_code_class``: two compiles, each model
    keeps its own (a model of the same class could run the other's compiled code)."""
    torch = pytest.importorskip("torch")
    from torch._dynamo.testing import CompileCounter

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x: Any) -> Any:
            return torch.relu(self.lin(x))

    torch._dynamo.reset()
    cnt = CompileCounter()
    a = torch.compile(M().eval(), backend=cnt)
    other = M().eval()
    other.__class__ = inductor.own_code_class(M)
    assert isinstance(other, M) and type(other).forward.__code__ is not M.forward.__code__
    b = torch.compile(other, backend=cnt)
    x = torch.randn(4, 8)
    for _ in range(2):
        a(x)
        b(x)
    assert cnt.frame_count == 2
    assert torch.equal(b(x), other(x)) and torch.equal(a(x), a._orig_mod(x))
    torch._dynamo.reset()


def test_second_compile_sharing_a_wrapper_module_gets_a_private_copy() -> None:
    """Inductor hands a second compile that generates the same code the first one's wrapper module
    (on the H200 under max-autotune): the round trip's hook loads it again privately, so a kernel
    replaced in the second compile's module leaves the first one's alone. Forced here on the CPU:
    the loader returns the first compile's module to the second compile."""
    torch = pytest.importorskip("torch")
    import shutil

    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("Inductor's CPU backend needs a C++ compiler")
    import torch._inductor.config as icfg
    from torch._inductor.codecache import PyCodeCache

    icfg.fx_graph_cache = False
    torch._dynamo.reset()

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x: Any) -> Any:
            return torch.relu(self.lin(x)) * 2 + 1

    torch.manual_seed(0)
    m1 = M().eval()
    m2 = inductor.own_code_class(M)().eval()
    m2.load_state_dict(m1.state_dict())
    x = torch.randn(4, 16)
    with torch.no_grad():
        with inductor.WrapperHook() as first:
            out1 = torch.compile(m1, dynamic=False)(x)
        assert len(first.modules) == 1
        orig = PyCodeCache.load_by_key_path

        def same_module(*a: Any, **k: Any) -> Any:
            m = orig(*a, **k)
            return first.modules[0] if hasattr(m, "call") else m

        PyCodeCache.load_by_key_path = staticmethod(same_module)  # type: ignore[method-assign, assignment]
        try:
            with inductor.WrapperHook(private_from=first.modules) as second:
                c2 = torch.compile(m2, dynamic=False)
                out2 = c2(x)
        finally:
            PyCodeCache.load_by_key_path = orig  # type: ignore[method-assign]
        private = [m for m in second.modules if m.__name__.endswith("_kforge_private")]
        assert len(private) == 1 and not any(m is first.modules[0] for m in second.modules)
        assert private[0].__file__ == first.modules[0].__file__
        assert torch.equal(out1, out2)
        # The private module's globals are its own, and the second compile runs them: a kernel
        # rebound there is called by the second compiled model only.
        names = [n for n in vars(private[0]) if n.startswith("cpp_fused")]
        assert names, "no C++ kernel global in the wrapper"
        calls: List[int] = []
        kernel = getattr(private[0], names[0])

        def counted(*a: Any, **k: Any) -> Any:
            calls.append(1)
            return kernel(*a, **k)

        setattr(private[0], names[0], counted)
        assert getattr(first.modules[0], names[0]) is kernel
        assert torch.equal(c2(x), out1) and len(calls) == 1
        torch.compile(m1, dynamic=False)(x)
        assert len(calls) == 1
    torch._dynamo.reset()


def test_round_trip_difference_names_host_time_and_extra_device_work() -> None:
    """Why a round trip is beyond noise: per call, device work by name (an extra copy, a slower
    kernel) and host time, largest first; equal runs say so."""
    def trace(kernels: List[Any]) -> List[Dict[str, Any]]:
        return [{"cat": c, "name": n, "dur": d} for c, n, d in kernels] + [{"cat": "cpu_op", "name": "aten::mm", "dur": 999}]

    base = traces.device_totals(trace([("kernel", "triton_poi_0", 10), ("kernel", "gemm", 100)] * 2), calls=2)
    assert base == {"triton_poi_0": {"count": 1.0, "us": 10.0}, "gemm": {"count": 1.0, "us": 100.0}}
    new = traces.device_totals(trace([("kernel", "triton_poi_0", 14), ("kernel", "gemm", 100),
                                       ("gpu_memcpy", "Memcpy DtoD", 50)] * 2), calls=2)
    d = traces.explain_difference(base, new, base_host_us=200.0, new_host_us=520.0)
    assert d["device_us"] == {"base": 110.0, "new": 164.0}
    assert d["why"].startswith("host +320 µs/call (200 → 520); device +54.0 µs/call")
    assert "Memcpy DtoD ×0→1 +50.0 µs" in d["why"] and "triton_poi_0 +4.0 µs" in d["why"]
    assert d["why"].index("Memcpy") < d["why"].index("triton_poi_0")
    assert "gemm" not in d["why"]
    # A launch only one side makes is named even when it is brief and comes after small rows.
    small = traces.explain_difference({"A": {"count": 1.0, "us": 100.0}, "B": {"count": 1.0, "us": 50.0}},
                                       {"A": {"count": 1.0, "us": 110.0}, "B": {"count": 1.0, "us": 50.9},
                                        "memset": {"count": 1.0, "us": 0.5}}, 10.0, 10.0)
    assert "memset ×0→1 +0.5 µs" in small["why"] and "A +10.0 µs" in small["why"] and "B " not in small["why"]
    same = traces.explain_difference(base, base, 200.0, 201.0)
    assert same["why"] == "no difference in device work or host time per call"


class FakeClock:
    """A clock that moves only when a fake call spends time (no sleeping, no real timing)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_host_probe_pairs_its_calls_and_stops_by_its_budget() -> None:
    """Two runs' host time, paired call by call: the sides alternate (each pair in the other order
    from the last), the GPU synchronized before each call; the difference is the median of the
    pairs' differences, so a host phase that doubles both sides' calls (session 32's LSTM) moves
    the pairs together; at least HOST_PAIRS_MIN pairs, more while within the budget, at most
    HOST_PAIRS_MAX."""
    clock, order, syncs = FakeClock(), [], [0]
    n = [0]

    def side(name: str, us: float, clock: FakeClock = clock) -> Callable[[], None]:
        def call() -> None:
            phase = 2.0 if (n[0] // 10) % 2 else 1.0  # the host twice as slow every other 10 calls
            clock.t += us * phase * 1e-6
            n[0] += 1
            order.append(name)
        return call

    host = traces.paired_host_us(lambda: syncs.__setitem__(0, syncs[0] + 1), side("b", 100.0), side("n", 110.0), clock)
    assert host["pairs"] == traces.HOST_PAIRS_MAX, host  # cheap calls: the most pairs
    assert order[:6] == ["b", "n", "n", "b", "b", "n"]
    assert syncs[0] == 2 * host["pairs"] + 1  # before every call, and once after
    assert host["delta_us"] == pytest.approx(10.0, abs=1e-3)
    assert 0 < host["half_us"] < 2.0, host
    slow_clock = FakeClock()
    slow = traces.paired_host_us(lambda: None, side("b", 1e5, slow_clock), side("n", 1e5, slow_clock), slow_clock)
    assert slow["pairs"] == traces.HOST_PAIRS_MIN  # 0.1 s calls: the least pairs, past the budget
    assert slow["delta_us"] == pytest.approx(0.0, abs=1e-3) and slow["half_us"] == pytest.approx(0.0, abs=1e-3)


def test_a_paired_host_difference_is_named_only_beyond_its_own_interval() -> None:
    """Host time is a reason a round trip is beyond noise only when the paired difference is
    beyond its interval (and 2 % of the call); within it, nothing is said about the host."""
    same = {"k": {"count": 1.0, "us": 50.0}}
    wide = traces.explain_difference(same, same, 1000.0, 1030.0, host_delta={"delta_us": 30.0, "half_us": 40.0, "pairs": 20})
    assert wide["why"] == "no difference in device work or host time per call", wide
    assert wide["host_us"] == {"base": 1000.0, "new": 1030.0, "delta": 30.0, "half": 40.0, "pairs": 20}
    tight = traces.explain_difference(same, same, 1000.0, 1030.0, host_delta={"delta_us": 30.0, "half_us": 10.0, "pairs": 20})
    assert tight["why"] == "host +30 µs/call (1000 → 1030, ±10 paired)", tight
    # The paired difference, not the medians': here they disagree in sign.
    signed = traces.explain_difference(same, same, 4198.0, 3492.0, host_delta={"delta_us": 150.0, "half_us": 20.0, "pairs": 60})
    assert signed["why"].startswith("host +150 µs/call"), signed


def test_pin_config_pins_or_says_why_not() -> None:
    """A replacement is pinned to the configuration its original autotuned to — or the round trip
    learns why not (never ran, other Inductor internals, several launchers) and nothing changed."""
    class Launcher:
        def __init__(self, config: str) -> None:
            self.config = config

    class Fresh:
        def __init__(self, launchers_made: int = 1) -> None:
            self.compile_results: List[Any] = ["a", "b", "c"]
            self.launchers: List[Any] = []
            self.made = launchers_made

        def _precompile_config(self, cfg: str) -> str:
            return f"compiled:{cfg}"

        def _make_launchers(self) -> None:
            self.launchers = [Launcher(r) for r in self.compile_results] * self.made

    class Old:
        launchers = [Launcher("XBLOCK=1024")]

    new = Fresh()
    assert inductor.pin_config(new, Old()) is None
    assert new.compile_results == ["compiled:XBLOCK=1024"] and len(new.launchers) == 1

    class Never:
        launchers: List[Any] = []

    untouched = Fresh()
    assert inductor.pin_config(untouched, Never()) == "the original has no launcher (never ran)"
    assert untouched.compile_results == ["a", "b", "c"]
    assert "Inductor internals differ: AttributeError" in str(inductor.pin_config(object(), Old()))
    assert inductor.pin_config(Fresh(launchers_made=2), Old()) == "half-pinned, discard it: 2 launchers after pinning"

    class Precompiled:  # compiled every config, never ran: which one would be arbitrary
        launchers = [Launcher("a"), Launcher("b")]

    assert inductor.pin_config(Fresh(), Precompiled()) == "the original has 2 launchers (not autotuned to one)"

    class Failing(Fresh):
        def _precompile_config(self, cfg: str) -> str:
            raise RuntimeError("out of resources: shared memory")

    failing = Failing()
    assert inductor.pin_config(failing, Old()) == "compiling the configuration failed: RuntimeError: out of resources: shared memory"
    assert failing.compile_results == ["a", "b", "c"]


def test_pin_config_reloads_a_function_left_behind_by_a_compile_worker() -> None:
    """A kernel compiled in Inductor's worker processes arrives without its Triton function
    (``fn.fn`` None); pinning compiles a configuration here, so it is reloaded first — and a
    kernel that cannot reload says so instead of failing inside Inductor."""
    class Fn:
        def __init__(self, fn: Any) -> None:
            self.fn = fn

    class Launcher:
        def __init__(self, config: str, static: bool = False) -> None:
            self.config = config
            self._is_static = static

    class FromWorker:
        def __init__(self, reload: bool) -> None:
            self.fn = Fn(None)
            self.compile_results: List[Any] = []
            self.launchers: List[Any] = []
            if reload:
                self._reload_kernel = lambda: types.SimpleNamespace(fn=Fn(lambda: None))

        def _precompile_config(self, cfg: str) -> str:
            if self.fn.fn is None:
                raise AttributeError("'NoneType' object has no attribute '__code__'")
            return f"compiled:{cfg}"

        def _make_launchers(self) -> None:
            self.launchers = [Launcher(r, static=True) for r in self.compile_results]

    class Old:
        launchers = [Launcher("XBLOCK=512")]

    k = FromWorker(reload=True)
    assert inductor.pin_config(k, Old()) is None
    assert k.fn.fn is not None and k.compile_results == ["compiled:XBLOCK=512"]
    why = inductor.pin_config(FromWorker(reload=False), Old())
    assert why is not None and why.startswith("the kernel's Triton function could not be reloaded") and "without its function" in why
    assert inductor.launcher_kinds([k, Old(), FromWorker(reload=False)]) == {"static": 1, "triton": 1, "none": 1}


def test_swapping_calls_one_model_with_original_or_replacement_kernels() -> None:
    """Without CUDA graphs the round trip times one compile against itself: each way of calling
    it first sets its kernels in the wrapper module, which looks them up at every call."""
    import types

    mod = types.ModuleType("wrapper")
    mod.k = "original"  # type: ignore[attr-defined]
    seen: List[str] = []
    originals, replacements = restitch.swapping([(mod, "k", "original", "replacement")], lambda: seen.append(mod.k))  # type: ignore[attr-defined]
    replacements()
    originals()
    originals()
    replacements()
    assert seen == ["replacement", "original", "original", "replacement"]
