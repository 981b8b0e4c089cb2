"""Pieces of the verify runner on the CPU: input generation, comparison, sentinels, rotation."""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Any, List, Optional

import pytest

torch = pytest.importorskip("torch")

from kforge import harness  # noqa: E402
from kforge.verify import checks, perf  # noqa: E402


def problem() -> types.SimpleNamespace:
    return types.SimpleNamespace(get_inputs=lambda: [torch.randn(8, 4), torch.randint(0, 5, (3,)), 7])


def test_inputs_keep_shapes_and_dtypes_and_follow_the_distribution() -> None:
    dev = torch.device("cpu")
    a = harness.make_inputs(problem(), 1, "normal", dev)
    b = harness.make_inputs(problem(), 1, "normal", dev)
    c = harness.make_inputs(problem(), 1, "uniform", dev)
    h = harness.make_inputs(problem(), 1, "heavy", dev)
    assert a[0].shape == (8, 4) and a[0].dtype == torch.float32 and a[1].dtype == torch.int64 and a[2] == 7
    assert torch.equal(a[0], b[0])  # deterministic per seed and distribution
    assert not torch.equal(a[0], c[0])
    assert float(c[0].abs().max()) <= 1.0
    assert float(h[0].abs().max()) <= 50.0


def test_compare_tolerances_nan_and_shapes() -> None:
    ref = torch.ones(4)
    assert harness.compare(ref + 5e-5, ref, {})["ok"]
    bad = harness.compare(ref + 1e-3, ref, {})
    assert not bad["ok"] and "beyond rtol" in bad["why"]
    nan = ref.clone()
    nan[2] = float("nan")
    assert "NaN" in harness.compare(nan, ref, {})["why"]
    assert "shape" in harness.compare(torch.ones(5), ref, {})["why"]
    assert "dtype" in harness.compare(ref.double(), ref, {})["why"]
    assert "raised ValueError" in harness.compare(ValueError("x"), ref, {})["why"]
    # bf16 gets its own (looser) default tolerance; a policy overrides it.
    r16 = ref.bfloat16()
    assert harness.compare(r16 * 1.005, r16, {})["ok"]
    assert not harness.compare(r16 * 1.005, r16, {"rtol": {"bfloat16": 0.0}, "atol": {"bfloat16": 0.0}})["ok"]


def test_rotation_changes_set_and_bumps_versions_not_contents() -> None:
    sets = [[torch.full((3,), float(k)), torch.arange(3)] for k in range(3)]
    rot = perf.Rotation(sets)
    assert rot.current() is sets[0]
    v = sets[1][0]._version
    rot.before()
    assert rot.current() is sets[1]
    assert sets[1][0]._version > v and torch.equal(sets[1][0], torch.full((3,), 1.0))
    rot.before()
    rot.before()
    assert rot.current() is sets[0]


def test_analytic_flops_of_the_reference() -> None:
    m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU())
    assert perf.analytic_flops(m, [torch.randn(8, 64)]) == 2 * 8 * 64 * 32
    # Element-wise work is not counted: bandwidth is the bound there.
    assert perf.analytic_flops(torch.nn.ReLU(), [torch.randn(8, 64)]) == 0


def test_sentinels_take_every_cached_block_then_give_back_the_fresh_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU, NaN blocks are allocated until the allocator has to reserve new memory (the
    cached free blocks, where a stale correct result may lie, are then all NaN); that last,
    fresh block's segment is given back. Simulated: 3 cached blocks, then fresh memory."""
    state = {"reserved": 100, "allocated": 0, "emptied": 0}

    class FakeCuda:
        @staticmethod
        def memory_reserved(device: object) -> int:
            return state["reserved"]

        @staticmethod
        def empty_cache() -> None:
            state["emptied"] += 1

    class Out:
        is_cuda = True
        device = "cuda:0"

        def is_floating_point(self) -> bool:
            return True

    def full_like(t: object, value: float) -> object:
        state["allocated"] += 1
        if state["allocated"] > 3:
            state["reserved"] += 10
        assert value != value  # NaN
        return object()

    monkeypatch.setattr(torch, "full_like", full_like)
    monkeypatch.setattr(torch, "cuda", FakeCuda)
    monkeypatch.setattr(torch, "Tensor", Out)
    checks.plant_sentinels([Out(), Out()])
    # First output: 3 cached blocks + 1 fresh; second: 1 fresh (the cache is NaN already).
    assert state["allocated"] == 5 and state["emptied"] == 2


class Model(torch.nn.Module):
    def forward(self, x: "torch.Tensor", y: "torch.Tensor") -> "torch.Tensor":
        return x + y


class WrongLater(torch.nn.Module):
    """Exact for its first ``good`` calls, then half the output is zero (a cheat of class 2:
    correct while checked, wrong while timed)."""

    def __init__(self, good: int) -> None:
        super().__init__()
        self.good, self.calls = good, 0

    def forward(self, x: "torch.Tensor", y: "torch.Tensor") -> "torch.Tensor":
        self.calls += 1
        out = x + y
        if self.calls > self.good:
            out[: out.numel() // 2] = 0
        return out


def input_sets(n: int = 3) -> "list[list[torch.Tensor]]":
    g = torch.Generator().manual_seed(5)
    return [[torch.randn(256, generator=g), torch.randn(256, generator=g)] for _ in range(n)]


def test_timed_sample_is_uniform_over_calls_and_copies_outside_the_call() -> None:
    """The reservoir keeps k calls; the copy is made in settle, and later calls may replace it."""
    import random

    sets = input_sets()
    rot = perf.Rotation(sets)
    s = perf.TimedSample(k=2, rng=random.Random(3))
    outs = []
    for _ in range(200):
        s.settle()
        rot.before()
        outs.append(s.call(lambda x, y: x + y, rot))
    s.settle()
    assert s.calls == 200 and len(s.kept) == 2
    for i, out in s.kept:
        assert torch.equal(out, sets[i][0] + sets[i][1])
        assert all(out is not o for o in outs), "kept outputs are copies"
    # Uniform over the calls: over many rounds, about half the kept calls are from the second half.
    kept = []
    for seed in range(200):
        n = [0]

        def numbered(x: "torch.Tensor", y: "torch.Tensor") -> "torch.Tensor":
            n[0] += 1
            return torch.full((1,), float(n[0]))

        t = perf.TimedSample(k=2, rng=random.Random(seed))
        for _ in range(100):
            t.settle()
            rot.before()
            t.call(numbered, rot)
        t.settle()
        kept += [int(out.item()) for _, out in t.kept]
    late = sum(1 for c in kept if c > 50) / len(kept)
    assert 0.4 < late < 0.6, late


def test_timed_outputs_are_validated_on_the_cpu_timing_loop() -> None:
    """The real interleaved timing loop (CPU samples; no daemon: regions are no-ops): an honest
    candidate's sampled outputs match the reference for their inputs; one that goes wrong after
    the checks' calls — during timing — is caught by the samples."""
    import random
    import warnings

    ref = Model()
    warnings.simplefilter("ignore")
    (tb, tc, tb2), ok = perf.timed_outputs_round(ref, ref, Model(), input_sets(), "test:timed", {}, rng=random.Random(0))
    assert ok["ok"] and ok["sampled"] == perf.TIMED_SAMPLES and ok["calls"] > perf.TIMED_SAMPLES, ok
    assert tb > 0 and tc > 0 and tb2 > 0
    _, bad = perf.timed_outputs_round(ref, ref, WrongLater(good=3), input_sets(), "test:timed", {}, rng=random.Random(0))
    assert not bad["ok"] and bad["failed"] >= 1 and "beyond rtol" in bad["why"], bad


def test_revalidation_checks_after_timing() -> None:
    ck = harness.Check()
    dev = torch.device("cpu")
    prob = types.SimpleNamespace(get_inputs=lambda: [torch.randn(64), torch.randn(64)])
    rounds = [{"ok": True, "calls": 10, "sampled": 2, "failed": 0, "why": ""}]
    perf.revalidate_after_timing(ck, prob, Model(), Model(), {}, dev, rounds)
    assert [(c["name"], c["ok"]) for c in ck.items] == [("revalidation-timed", True), ("revalidation-after-timing", True)]
    ck = harness.Check()
    perf.revalidate_after_timing(ck, prob, Model(), WrongLater(good=0), {}, dev, rounds + [dict(rounds[0], ok=False, why="x")])
    assert [(c["name"], c["ok"]) for c in ck.items] == [("revalidation-timed", False), ("revalidation-after-timing", False)]
    assert ck.items[0]["evidence"]["why"] == "round 1: x"


def test_thread_origins_torch_threads_are_not_the_candidates() -> None:
    """A thread started by torch's code (Inductor's compile-worker timer, the thread that once
    rejected an honest candidate) is allowed; a thread the candidate's code starts is a finding,
    also through an executor."""
    import concurrent.futures
    import threading

    from torch._inductor.compile_worker.timer import Timer

    harness.record_thread_origins()
    before = set(threading.enumerate())
    native0 = harness.native_threads()
    timer = Timer(3600.0, lambda: None)
    timer.record_call()
    ck = harness.Check()
    harness.thread_check(ck, "thread-count", before, False, native_before=native0)
    ev = ck.items[0]["evidence"]
    assert ck.items[0]["ok"] is True, ev
    assert [t["allowed"] for t in ev["threads"]] == ["torch"] and ev["threads"][0]["name"] == "subproc_worker_timer"
    assert "timer.py" in ev["threads"][0]["origin"]

    stop = threading.Event()
    mine = threading.Thread(target=stop.wait, name="mine", daemon=True)
    mine.start()
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pooled")
    pool.submit(lambda: None).result()
    ck = harness.Check()
    harness.thread_check(ck, "thread-count", before, False)
    ev = ck.items[0]["evidence"]
    assert ck.items[0]["ok"] is False
    assert sorted(ev["started"]) == ["mine", "pooled_0"], ev
    assert all(__file__ in t["origin"] for t in ev["threads"] if t["name"] in ("mine", "pooled_0")), ev
    stop.set()
    pool.shutdown()
    timer.quit()


def test_a_third_party_librarys_thread_is_its_callers(tmp_path: "pytest.TempPathFactory", monkeypatch: "pytest.MonkeyPatch") -> None:
    """A thread an installed library starts (tqdm's monitor thread, for a progress bar Inductor's
    compile draws — it once rejected four honest candidates) is attributed to the library's
    caller: allowed when an allow-listed package called it, the candidate's when its code did."""
    import sys
    import threading

    site = str(tmp_path) + "/site"  # type: ignore[operator]
    os.makedirs(site + "/monitorlib")
    os.makedirs(site + "/allowedpkg")
    with open(site + "/monitorlib/__init__.py", "w") as f:
        f.write("import threading\nSTOP = threading.Event()\n"
                "def start(name):\n    t = threading.Thread(target=STOP.wait, name=name, daemon=True)\n"
                "    t.start()\n    return t\n")
    with open(site + "/allowedpkg/__init__.py", "w") as f:
        f.write("import monitorlib\ndef progress_bar():\n    return monitorlib.start('lib-monitor')\n")
    real = harness._stdlib_dirs()
    monkeypatch.setattr(harness, "_stdlib_dirs", lambda: (real[0], real[1] + (os.path.realpath(site) + os.sep,)))
    monkeypatch.setattr(harness, "ALLOWED_THREAD_ORIGINS", ("torch", "triton", "allowedpkg"))
    monkeypatch.syspath_prepend(site)
    import allowedpkg  # type: ignore[import-not-found]
    import monitorlib  # type: ignore[import-not-found]

    harness.record_thread_origins()
    before = set(threading.enumerate())
    allowedpkg.progress_bar()
    ck = harness.Check()
    harness.thread_check(ck, "thread-count", before, False)
    ev = ck.items[0]["evidence"]
    assert ck.items[0]["ok"] is True, ev
    assert ev["threads"][0]["allowed"] == "allowedpkg" and "allowedpkg" in ev["threads"][0]["origin"], ev

    monitorlib.start("candidate-monitor")  # the candidate calls the library itself
    ck = harness.Check()
    harness.thread_check(ck, "thread-count", before, False)
    ev = ck.items[0]["evidence"]
    assert ck.items[0]["ok"] is False and ev["started"] == ["candidate-monitor"], ev
    assert __file__ in next(t["origin"] for t in ev["threads"] if t["name"] == "candidate-monitor"), ev
    monitorlib.STOP.set()
    for m in ("allowedpkg", "monitorlib"):
        sys.modules.pop(m, None)


def test_progress_file_records_checks_and_the_check_running(tmp_path: "pytest.TempPathFactory") -> None:
    import json

    p = str(tmp_path) + "/progress.jsonl"  # type: ignore[operator]
    ck = harness.Check(p)
    ck.begin("dry-run", "runs")
    ck.add("dry-run", "runs", True, launches=1, x=float("inf"))
    ck.begin("correctness", "seed-0-normal")
    lines = [json.loads(line) for line in open(p)]
    assert lines[0] == {"running": {"gate": "dry-run", "name": "runs"}}
    assert lines[1]["check"]["name"] == "runs" and lines[1]["check"]["evidence"]["x"] == "inf"
    assert lines[2] == {"running": {"gate": "correctness", "name": "seed-0-normal"}}


def test_environment_errors_are_not_the_candidates() -> None:
    cpu = torch.device("cpu")
    env = checks.environment_error(RuntimeError("0 active drivers ([]). There should only be one."), cpu)
    assert env is not None and "--device cpu" in env.fix
    assert checks.environment_error(ValueError("wrong shape"), cpu) is None
    # CPU out-of-memory is the candidate's own (no siblings on a GPU to blame).
    assert checks.environment_error(RuntimeError("CUDA out of memory"), cpu) is None


def test_gpu_out_of_memory_is_the_environments_only_when_others_held_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = types.SimpleNamespace(type="cuda")
    gib = 1 << 30
    state = {"free": 1 * gib, "total": 80 * gib, "own": 10 * gib}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda dev=None: (state["free"], state["total"]))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda dev=None: state["own"])
    env = checks.environment_error(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), gpu)
    assert env is not None and "other processes held 69.0 GiB" in str(env) and env.fix
    state["own"] = 79 * gib  # the candidate's own
    assert checks.environment_error(RuntimeError("CUDA out of memory"), gpu) is None
    own = checks.own_failure(RuntimeError("CUDA out of memory"), gpu)
    assert "this process held 79.0 GiB" in str(own)


def test_performance_gate_validates_timed_outputs_end_to_end_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gate 4 as a whole, its GPU-only parts replaced: the baseline is the reference itself
    (no torch.compile), the device peaks are constants; timing is the real interleaved loop on
    CPU samples. An honest candidate's timed outputs pass; one exact for its first 5 calls and
    wrong from then on — during timing — is rejected by exploits:revalidation-timed."""
    import warnings

    warnings.simplefilter("ignore")
    monkeypatch.setattr(torch, "compile", lambda m, mode=None: m)
    monkeypatch.setattr(perf, "copy_bandwidth", lambda dev: 1e15)
    monkeypatch.setattr(perf, "matmul_rate", lambda dev, dtype: 1e18)
    prob = types.SimpleNamespace(get_inputs=lambda: [torch.randn(512), torch.randn(512)])
    dev = torch.device("cpu")
    for cand, ok in ((Model(), True), (WrongLater(good=5), False)):
        ck = harness.Check()
        perf.performance_gate(ck, prob, Model(), cand, {"rounds": 2}, dev)
        by = {(c["gate"], c["name"]): c for c in ck.items}
        timed = by[("exploits", "revalidation-timed")]
        assert timed["ok"] is ok, timed
        assert len(timed["evidence"]["rounds"]) == 2 and all(r["sampled"] == perf.TIMED_SAMPLES for r in timed["evidence"]["rounds"])
        assert by[("exploits", "revalidation-after-timing")]["ok"] is ok
        assert ("performance", "speedup") in by and ("performance", "thread-count-timed") in by


def test_gate_4_times_a_round_in_a_tainted_region_again_a_bounded_number_of_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """Gate 4: a round whose region was not exclusive (tainted) is timed again, at most
    TAINTED_RETAKES times; a later tainted round is kept; the speedup check counts both, and
    every timed round's sample is validated, the retaken ones too."""
    import warnings

    warnings.simplefilter("ignore")
    monkeypatch.setattr(torch, "compile", lambda m, mode=None: m)
    monkeypatch.setattr(perf, "copy_bandwidth", lambda dev: 1e15)
    monkeypatch.setattr(perf, "matmul_rate", lambda dev, dtype: 1e18)
    real = perf.do_bench_interleaved
    calls: List[str] = []

    def bench(fns: Any, regions: Optional[List[Any]] = None, **kw: Any) -> Any:
        out = real(fns, **kw)
        calls.append(kw["name"])
        assert regions is not None, "gate 4 asks for the region"
        regions.append(types.SimpleNamespace(tainted=len(calls) <= 3))  # the first three
        return out

    monkeypatch.setattr(perf, "do_bench_interleaved", bench)
    prob = types.SimpleNamespace(get_inputs=lambda: [torch.randn(512), torch.randn(512)])
    ck = harness.Check()
    phases = perf.performance_gate(ck, prob, Model(), Model(), {"rounds": 2}, torch.device("cpu"))
    by = {(c["gate"], c["name"]): c for c in ck.items}
    speed = by[("performance", "speedup")]["evidence"]
    assert harness.TAINTED_RETAKES == 2
    assert speed["tainted_rounds"] == {"retaken": 2, "kept": 1}, speed
    assert len(speed["per_round"]) == 2, "two rounds counted"
    assert calls == ["verify:round-0"] * 3 + ["verify:round-1"]
    timed = by[("exploits", "revalidation-timed")]
    assert timed["ok"] and [r["round"] for r in timed["evidence"]["rounds"]] == [0, 0, 0, 1], timed
    assert list(phases) == ["baseline-compile", "timing", "revalidation-after-timing", "plausibility"], phases


def test_outputs_that_are_nan_in_the_same_places_are_the_same() -> None:
    """A reference whose output is NaN for redrawn inputs (KL divergence of negative
    "probabilities": log of a negative value) read twice is the same output: the streams check
    once rejected the reference's own eager forward this way (``torch.equal`` of NaN is False)."""
    a = torch.tensor([1.0, float("nan"), 3.0])
    assert not torch.equal(a, a.clone())
    assert harness.same_tensor(a, a.clone())
    assert not harness.same_tensor(a, torch.tensor([1.0, float("nan"), 4.0]))
    assert not harness.same_tensor(a, torch.tensor([1.0, 2.0, 3.0]))
    assert harness.same_values([a, 2], [a.clone(), 2]) and not harness.same_values([a, 2], [a.clone(), 3])
    i = torch.arange(4)
    assert harness.same_tensor(i, i.clone()) and not harness.same_tensor(i, i + 1)


def _helper(x: "torch.Tensor") -> "torch.Tensor":
    def inner(y: "torch.Tensor") -> "torch.Tensor":
        return y * 2.0

    return inner(x)


def _twice(x: "torch.Tensor") -> "torch.Tensor":
    return x * 2.0


@torch.compile(backend="eager")
def _decorated(x: "torch.Tensor") -> "torch.Tensor":
    return x + 1.0


class _Outer:
    class Inner:
        def method(self) -> int:
            return 1

        @staticmethod
        def static() -> int:
            return 2

        @property
        def prop(self) -> int:
            return 3


def test_the_candidates_code_forgets_dynamos_skip_mark_before_gate_4() -> None:
    """Dynamo marks a frame it met under the dispatch record "skip" (torch 2.11), and the compiled
    forward then ran eagerly in gate 4: a config result measured 1.14x by its agent was timed at
    0.55x. The candidate's own code objects (methods, functions, nested ones; not torch's) are
    reset before gate 4, and a compiled function whose code was marked skip compiles again."""
    import sys

    from torch._dynamo.types import FrameAction, FrameExecStrategy
    from torch._dynamo.utils import counters

    from kforge.verify.dispatch import candidate_codes, forget_dynamo_state

    module = sys.modules[__name__]
    codes = candidate_codes(module)
    names = {c.co_name for c in codes}
    assert {"_helper", "inner", "forward", "_decorated", "method", "static", "prop",
            "test_the_candidates_code_forgets_dynamos_skip_mark_before_gate_4"} <= names
    assert all(c.co_filename == __file__ for c in codes), "only this file's code, never torch's (compile_wrapper)"
    tree = torch.nn.Sequential(torch.nn.Linear(2, 2))
    linear = torch.nn.Linear.forward.__code__
    assert linear in candidate_codes(module, tree) and linear not in codes, "a compiled nn.Linear: torch's forward too"

    torch._dynamo.reset()
    eval_frame = torch._C._dynamo.eval_frame
    eval_frame.set_code_exec_strategy(_twice.__code__, FrameExecStrategy(FrameAction.SKIP, FrameAction.DEFAULT))
    compiled = torch.compile(_twice, backend="eager")
    before = counters["frames"]["ok"]
    compiled(torch.ones(4))
    assert counters["frames"]["ok"] == before, "the skip mark made it run eagerly"
    assert forget_dynamo_state(module) == len(codes)
    compiled(torch.ones(4))
    assert counters["frames"]["ok"] > before, "compiled once the mark was reset"


def test_a_compiled_forward_called_while_fx_traces_runs_eagerly_instead_of_raising() -> None:
    """torch 2.11's FX-tracing flag is process-wide, so the baseline compiling in its thread made a
    candidate's own torch.compile raise in the checks. With the setting the baseline compile makes,
    such a call runs the function eagerly."""
    import torch.fx._symbolic_trace as fx_trace

    compiled = torch.compile(_twice, backend="eager")
    saved = torch._dynamo.config.error_on_nested_fx_trace
    perf.compiled_calls_while_tracing_run_eagerly()
    try:
        assert torch._dynamo.config.error_on_nested_fx_trace is False
        fx_trace._set_is_fx_tracing(True)
        try:
            out = compiled(torch.ones(3))
        finally:
            fx_trace._set_is_fx_tracing(False)
        assert torch.equal(out, torch.full((3,), 2.0))
    finally:
        torch._dynamo.config.error_on_nested_fx_trace = saved


class _Scale(torch.nn.Module):
    def forward(self, x: "torch.Tensor") -> "torch.Tensor":
        return x * 2.0


class _HonestWhenWatched(_Scale):
    """Right while a dispatch mode (the record) is active, wrong otherwise: the cheat the
    unrecorded forward catches on a CPU run, which has no gate 4."""

    def forward(self, x: "torch.Tensor") -> "torch.Tensor":
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        return x * 2.0 if _get_current_dispatch_mode() is not None else x * 2.5


def test_a_forward_that_changes_outside_the_dispatch_record_is_rejected() -> None:
    import threading

    from kforge.verify.cascade import run_checks

    prob = types.SimpleNamespace(Model=_Scale, get_inputs=lambda: [torch.randn(64)], get_init_inputs=lambda: [])
    verdicts = {}
    for cls in (_Scale, _HonestWhenWatched):
        cand = types.ModuleType("candidate")
        cand.ModelNew = cls  # type: ignore[attr-defined]
        res = run_checks(prob, cand, {"torch_policy": "reference-ops"}, torch.device("cpu"), False, {},
                         set(threading.enumerate()))
        by = {(c["gate"], c["name"]): c for c in res["checks"]}
        assert [k for k, c in by.items() if c["ok"] is False] in ([], [("exploits", "unrecorded-forward")])
        verdicts[cls.__name__] = by[("exploits", "unrecorded-forward")]["ok"]
        assert by[("correctness", "seed-0-normal")]["ok"] is True, "under the record both are right"
    assert verdicts == {"_Scale": True, "_HonestWhenWatched": False}


def test_the_judge_takes_the_fp64_rule_only_for_a_tolerance_miss() -> None:
    """harness.judge: a more accurate output beyond 1e-4 passes by the fp64 rule; a NaN, a wrong
    shape or an integer output is decided by the tolerance alone; a worse one fails both."""

    class Cancel(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return (x * 1e4 + 1.0) - x * 1e4

    torch.manual_seed(0)
    x = torch.randn(64, 1024)
    ref = Cancel()(x)
    fp64 = harness.Fp64Reference(Cancel())
    exact = harness.judge(torch.ones_like(x), ref, {}, fp64, lambda: [x])
    assert exact["ok"] and exact["rule"] == "fp64-ratio" and "beyond rtol" in exact["beyond_tolerance"]
    worse = harness.judge(torch.ones_like(x) + 0.05, ref, {}, fp64, lambda: [x])
    assert not worse["ok"] and worse["rho"] > 10 and "the fp64 rule fails too" in worse["why"]
    nan = torch.ones_like(x)
    nan[0, 0] = float("nan")
    asked: List[int] = []
    assert "NaN" in harness.judge(nan, ref, {}, fp64, lambda: asked.append(1) or [x])["why"]
    assert "shape" in harness.judge(torch.ones(3), ref, {}, fp64, lambda: asked.append(1) or [x])["why"]
    ints = harness.judge(torch.ones(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int64), {}, fp64,
                         lambda: asked.append(1) or [x])
    assert not ints["ok"] and asked == []  # the fp64 rule never asked for inputs


RECORDS_FLAGS = """
import torch
SEEN = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
{extra}
class Model(torch.nn.Module):
    def forward(self, x):
        return x
def get_inputs():
    return [torch.randn(2)]
def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("loader", ["harness", "capture"])
def test_a_problem_is_imported_in_strict_fp32_and_may_set_tf32_itself(tmp_path: "pytest.TempPathFactory", loader: str) -> None:
    from kforge.inspect import capture

    def load(name: str, extra: str) -> types.ModuleType:
        path = os.path.join(str(tmp_path), name)
        with open(path, "w") as f:
            f.write(RECORDS_FLAGS.format(extra=extra))
        if loader == "harness":
            return harness.load_problem(path, "default", "strict-test")  # type: ignore[no-any-return]
        kind, mod = capture.load_sized(path, "default")
        assert kind == "problem"
        return mod  # type: ignore[no-any-return]

    saved = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    try:  # torch's own defaults (cuDNN TF32 on), and a process that turned cuBLAS TF32 on
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, True
        assert load("plain.py", "").SEEN == (False, False)
        assert torch.backends.cudnn.allow_tf32 is False and torch.backends.cuda.matmul.allow_tf32 is False
        own = load("own.py", "torch.backends.cudnn.allow_tf32 = True")
        assert own.SEEN == (False, False) and torch.backends.cudnn.allow_tf32 is True  # its own choice stands
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_the_runner_imports_the_problem_and_the_candidate_in_strict_fp32(tmp_path: "pytest.TempPathFactory") -> None:
    """A fresh process (torch's own cuDNN TF32 default on): the problem and the candidate each
    see TF32 off when imported, and the runner writes its verdict."""
    import subprocess
    import sys

    seen = os.path.join(str(tmp_path), "seen.txt")
    record = ("import torch\nwith open({seen!r}, 'a') as f:\n"
              "    f.write('%s %s %s\\n' % ({who!r}, torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32))\n")
    problem, candidate = os.path.join(str(tmp_path), "p.py"), os.path.join(str(tmp_path), "c.py")
    with open(problem, "w") as f:
        f.write(record.format(seen=seen, who="problem") + RECORDS_FLAGS.format(extra=""))
    with open(candidate, "w") as f:
        f.write(record.format(seen=seen, who="candidate")
                + RECORDS_FLAGS.format(extra="").replace("class Model(", "class ModelNew("))
    python_dir = os.path.dirname(os.path.dirname(os.path.abspath(harness.__file__)))
    env = {**os.environ, "PYTHONPATH": python_dir}
    env.pop("KFORGE_SOCKET", None)
    out = os.path.join(str(tmp_path), "r.json")
    run = subprocess.run([sys.executable, "-m", "kforge.verify.runner", problem, candidate, "--out", out,
                          "--device", "cpu", "--no-performance"], env=env, capture_output=True, text=True, timeout=600)
    assert os.path.exists(out), run.stderr[-2000:]
    with open(seen) as f:
        lines = sorted(set(f.read().split("\n")) - {""})
    assert lines == ["candidate False False", "problem False False"], lines


def test_the_runner_refuses_an_in_process_warm_worker_before_patching_anything(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """In a warm worker that runs jobs in-process the runner exits 2 at once, the fix named, with
    ``threading.Thread.start`` untouched (it would stay patched for the worker's later jobs); the
    variable inherited by another process (another pid) is not such a worker."""
    import threading

    from kforge.verify import runner

    start = threading.Thread.start
    monkeypatch.setenv("KFORGE_WARM_ISOLATION", f"in-process:{os.getpid()}")
    assert runner.warm_isolation() == "in-process"
    assert runner.main(["p.py", "c.py", "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert "kforge verify fix: start the daemon with --worker-fork" in err
    assert threading.Thread.start is start
    monkeypatch.setenv("KFORGE_WARM_ISOLATION", f"in-process:{os.getpid() + 1}")
    assert runner.warm_isolation() is None, "a process the job started"
    monkeypatch.setenv("KFORGE_WARM_ISOLATION", f"fork:{os.getpid()}")
    assert runner.warm_isolation() == "fork"
