"""The dispatch agent of ``kforge optimize`` on the CPU: its input checks, the choice rule on
given round times, and one measurement end to end (eager against Inductor's CPU backend)."""

from __future__ import annotations

import json
import math
import os
import runpy
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
torch = pytest.importorskip("torch")

from kforge.optimize import dispatch  # noqa: E402
from kforge.optimize import rewrite as rw  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VECTOR_ADD = str(REPO / "tests" / "candidates" / "problems" / "vector_add.py")


def test_modes_are_checked_and_the_baseline_comes_first() -> None:
    assert dispatch.parse_modes("eager, default", "default", "cpu") == ["default", "eager"]
    for text, baseline, device, why in (
        ("eager,turbo", "eager", "cpu", "unknown mode 'turbo'"),
        ("eager,default", "fastest", "cpu", "unknown mode 'fastest'"),
        ("eager,reduce-overhead", "eager", "cpu", "'reduce-overhead' uses CUDA graphs"),
        ("eager,default,eager", "default", "cpu", "named twice"),
        ("eager", "eager", "cpu", "nothing to compare"),
    ):
        with pytest.raises(dispatch.DispatchError, match=why):
            dispatch.parse_modes(text, baseline, device)
    assert dispatch.parse_modes("eager,reduce-overhead", "eager", "cuda") == ["eager", "reduce-overhead"]
    # The inductor agent's variants: the baseline's mode with one knob changed, each alone.
    assert dispatch.parse_modes("eager", "default", "cpu", "freezing,aggressive-fusion") == [
        "default", "eager", "default+freezing", "default+aggressive-fusion"]
    for knobs, baseline, why in (("turbo", "default", "unknown knob 'turbo'"), ("freezing", "eager", "need a compiled baseline"),
                                 ("freezing,freezing", "default", "named twice")):
        with pytest.raises(dispatch.DispatchError, match=why):
            dispatch.parse_modes("eager", baseline, "cpu", knobs)


def test_a_knob_variant_compiles_with_its_modes_options_and_the_knob() -> None:
    mode, options = dispatch.variant_options("max-autotune+no-epilogue-fusion")
    assert mode == "max-autotune" and options is not None
    assert options["epilogue_fusion"] is False and options["max_autotune"] is True, options
    assert dispatch.variant_options("default") == ("default", None)


def test_knob_combinations_are_variants_of_their_own() -> None:
    """The beam's second round: the best knobs of the first combined, ``MODE+K1+K2``, compiled
    with every knob's setting; each part must be a known knob, none twice, no combination twice
    (in any order)."""
    assert dispatch.parse_modes("", "default", "cpu", "freezing+aggressive-fusion,freezing") == [
        "default", "default+freezing+aggressive-fusion", "default+freezing"]
    for knobs, why in (("freezing+turbo", "unknown knob 'turbo'"), ("freezing+freezing", "named twice in the combination"),
                       ("freezing+aggressive-fusion,aggressive-fusion+freezing", "named twice")):
        with pytest.raises(dispatch.DispatchError, match=why):
            dispatch.parse_modes("eager", "default", "cpu", knobs)
    mode, options = dispatch.variant_options("max-autotune+no-epilogue-fusion+freezing")
    assert mode == "max-autotune" and options is not None
    assert (options["epilogue_fusion"], options["freezing"], options["max_autotune"]) == (False, True, True), options
    assert dispatch.variant_knobs("default+freezing+aggressive-fusion") == ("default", ["freezing", "aggressive-fusion"])
    assert dispatch.variant_knobs("eager") == ("eager", [])


def rounds(base: List[float], mode: List[float], again: List[float]) -> List[Tuple[float, float, float]]:
    return list(zip(base, mode, again))


def test_the_fastest_mode_beyond_noise_wins_else_the_baseline_stays() -> None:
    steady = [1.0, 1.01, 0.99, 1.0, 1.0]
    per_round = {"default": rounds(steady, [0.50, 0.51, 0.49, 0.50, 0.50], steady),
                 "max-autotune-no-cudagraphs": rounds(steady, [0.80, 0.81, 0.79, 0.80, 0.80], steady)}
    c = dispatch.choose("eager", per_round)
    assert (c["winner"], c["fallback"]) == ("default", False)
    assert c["modes"]["default"]["speedup"] == pytest.approx(2.0, rel=0.02)
    assert c["modes"]["default"]["ci95"][0] > c["noise_floor"]
    assert len(c["modes"]["default"]["per_round"]) == 5
    # Faster on average, but the baseline timed twice disagrees with itself by as much: noise.
    noisy = [1.0, 1.3, 0.8, 1.2, 0.9]
    c = dispatch.choose("eager", {"default": rounds(steady, [0.95, 0.97, 0.96, 0.95, 0.96], noisy)})
    assert (c["winner"], c["fallback"]) == ("eager", True)
    assert c["modes"]["default"]["beyond_noise"] is False
    # Slower than the baseline: never the winner.
    c = dispatch.choose("eager", {"default": rounds(steady, [2.0] * 5, steady)})
    assert (c["winner"], c["fallback"]) == ("eager", True) and c["modes"]["default"]["speedup"] < 1


def test_the_noise_floor_counts_each_round_once() -> None:
    """Baseline and baseline again belong to the round, not to a mode: with three modes the floor
    is the same as with one (three copies of each round would narrow its interval)."""
    base, again = [1.0, 1.0, 1.0], [1.02, 0.99, 1.01]
    one = dispatch.choose("eager", {"default": rounds(base, [0.5] * 3, again)})
    three = dispatch.choose("eager", {m: rounds(base, [0.5] * 3, again) for m in ("default", "max-autotune", "max-autotune-no-cudagraphs")})
    assert one["noise_floor"] == pytest.approx(three["noise_floor"])
    noise = [math.log(c / a) for a, c in zip(base, again)]
    assert one["noise_floor"] > math.exp(abs(sum(noise) / 3))


def test_a_mode_that_computes_otherwise_is_left_out_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    real = dispatch.build

    def build(model: Any, mode: str) -> Any:
        if mode == "default":
            return lambda *xs: real(model, "eager")(*xs) * 2  # wrong
        if mode == "max-autotune-no-cudagraphs":
            raise RuntimeError("compiler exploded")
        return real(model, mode)

    monkeypatch.setattr(dispatch, "build", build)
    problem = dispatch.load_problem(VECTOR_ADD, "default")
    r = dispatch.measure(problem, ["eager", "default", "max-autotune-no-cudagraphs"], torch.device("cpu"), 2)
    assert r["prepared"]["default"]["ok"] is False and "beyond rtol" in r["prepared"]["default"]["why"]
    assert r["prepared"]["max-autotune-no-cudagraphs"] == {"ok": False, "why": "RuntimeError: compiler exploded"}
    assert (r["winner"], r["fallback"]) == ("eager", True) and "no mode besides the baseline" in r["why"]


def test_past_its_deadline_a_step_prepares_only_the_baseline_and_says_what_it_left(
        capsys: pytest.CaptureFixture[str]) -> None:
    problem = dispatch.load_problem(VECTOR_ADD, "default")
    modes = ["eager", "default", "max-autotune-no-cudagraphs"]
    r = dispatch.measure(problem, modes, torch.device("cpu"), 2, ["exact"], until=time.time() - 1.0)
    assert r["prepared"]["eager"]["ok"] is True, "the baseline is always prepared"
    for mode in modes[1:]:
        assert r["prepared"][mode] == {"ok": False, "not_prepared": dispatch.NOT_PREPARED}
    assert r["not_prepared"] == ["default", "max-autotune-no-cudagraphs", "the rewrite"]
    assert r["rewrite"] is None and r["prepare_until"] < time.time()
    assert (r["winner"], r["fallback"]) == ("eager", True)
    assert "not prepared, the step's deadline came first: default, max-autotune-no-cudagraphs, the rewrite" in r["why"]
    err = capsys.readouterr().err
    assert "dispatch: prepared eager (1 of 3)" in err and "dispatch: not prepared default (2 of 3)" in err
    # A deadline ahead: every variant prepared, nothing said about it.
    r = dispatch.measure(problem, modes[:2], torch.device("cpu"), 2, until=time.time() + 600.0)
    assert r["prepared"]["default"]["ok"] is True and "not_prepared" not in r


class Clock:
    """A step's clock that moves only when a variant is built: each build takes ``cost[mode]``."""

    def __init__(self, cost: Dict[str, float]) -> None:
        self.now, self.cost = 1000.0, cost

    def build(self, real: Any) -> Any:
        def build(model: Any, mode: str) -> Any:
            self.now += self.cost[mode]
            return real(model, "eager")
        return build


class Warmed:
    """Compile workers that already compiled ``done`` (and nothing else)."""
    count = 1

    def __init__(self, done: List[str]) -> None:
        self.done = done

    def compiled(self, variant: str) -> bool:
        return variant in self.done

    def wait(self, variant: str, deadline: Any = None) -> Any:
        return {"variant": variant, "ok": True, "seconds": 1.0} if variant in self.done else None

    def release(self) -> None:
        """None of them is held."""


def test_a_bounded_step_still_prepares_eager_and_the_warmed_variants_after_a_long_baseline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The GRU's case: the baseline's compile took most of the step; the cold variants are
    left, eager (no compile) and what a worker compiled (a cache hit) are not."""
    clock = Clock({"default": 100.0, "max-autotune-no-cudagraphs": 100.0, "default+freezing": 1.0, "eager": 0.0})
    monkeypatch.setattr(dispatch, "build", clock.build(dispatch.build))
    monkeypatch.setattr(dispatch, "time", SimpleNamespace(time=lambda: clock.now, perf_counter=lambda: clock.now))
    ref = dispatch.reference(dispatch.load_problem(VECTOR_ADD, "default"), torch.device("cpu"))
    modes = ["default", "max-autotune-no-cudagraphs", "eager", "default+freezing"]
    ready, report = dispatch.prepare_modes(ref, modes, torch.device("cpu"), until=clock.now + 150.0,
                                           workers=Warmed(["default+freezing"]))  # type: ignore[arg-type]
    assert sorted(ready) == ["default", "default+freezing", "eager"]
    assert report["max-autotune-no-cudagraphs"] == {"ok": False, "not_prepared": dispatch.NOT_PREPARED}
    assert report["default+freezing"]["warmed"]["ok"] is True
    # Without the worker's word the freezing variant is expected to take the baseline's 100 s.
    clock.now = 1000.0
    ready, report = dispatch.prepare_modes(ref, modes, torch.device("cpu"), until=clock.now + 150.0,
                                           workers=Warmed([]))  # type: ignore[arg-type]
    assert sorted(ready) == ["default", "eager"] and report["default+freezing"]["not_prepared"] == dispatch.NOT_PREPARED
    # Before a cache hit was timed one is expected to take a share of the longest cold compile.
    clock.now = 1000.0
    left = 100.0 + dispatch.WARM_SHARE * 100.0 - 1.0
    ready, report = dispatch.prepare_modes(ref, modes, torch.device("cpu"), until=clock.now + left,
                                           workers=Warmed(["default+freezing"]))  # type: ignore[arg-type]
    assert sorted(ready) == ["default", "eager"] and report["default+freezing"]["not_prepared"] == dispatch.NOT_PREPARED


def compile_outliving_the_step(never: str) -> None:
    """A compile that outlives the step: it spins until the deadline's alarm interrupts it (at
    most 60 s, then fails the test with ``never``)."""
    limit = time.monotonic() + 60.0
    while time.monotonic() < limit:
        pass
    raise AssertionError(never)


def test_a_compile_still_running_at_the_deadline_is_interrupted(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A max-autotune compile under load outlived a bounded step (expected to take the longest
    compile so far, it took longer than the rest of the step) and the run killed the step with
    its work: the deadline's alarm interrupts it; what was prepared before stays ready, it and
    the variants after it are not prepared, and the alarm is gone afterwards."""
    real = dispatch.build

    def build(model: Any, mode: str) -> Any:
        if mode == "max-autotune-no-cudagraphs":
            compile_outliving_the_step("the deadline's alarm never interrupted the compile")
        return real(model, "eager")

    monkeypatch.setattr(dispatch, "build", build)
    ref = dispatch.reference(dispatch.load_problem(VECTOR_ADD, "default"), torch.device("cpu"))
    modes = ["default", "eager", "max-autotune-no-cudagraphs", "default+freezing"]
    dispatch.prepare_modes(ref, modes[:2], torch.device("cpu"))  # the first calls' one-time costs paid here
    ready, report = dispatch.prepare_modes(ref, modes, torch.device("cpu"), until=time.time() + 2.0)
    assert sorted(ready) == ["default", "eager"]
    assert report["max-autotune-no-cudagraphs"] == {"ok": False, "not_prepared": dispatch.INTERRUPTED}
    assert report["default+freezing"] == {"ok": False, "not_prepared": dispatch.NOT_PREPARED}
    assert "interrupted max-autotune-no-cudagraphs after" in capsys.readouterr().err
    import signal
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0) and signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
    # The baseline is not interrupted at the preparation's deadline: past it, it is prepared all the same.
    ready, report = dispatch.prepare_modes(ref, modes[:2], torch.device("cpu"), until=time.time() - 1.0)
    assert list(ready) == ["default"] and report["eager"]["not_prepared"] == dispatch.NOT_PREPARED
    # Only at the step's end: a baseline whose compile outlives the whole step fails the step
    # with the reason, instead of the run's kill taking every sibling's work with it.
    slow = ["max-autotune-no-cudagraphs", "eager"]
    ready, report = dispatch.prepare_modes(ref, slow, torch.device("cpu"), until=time.time() + 0.5, end=time.time() + 1.0)
    assert ready == {} and report["eager"] == {"ok": False, "not_prepared": dispatch.NOT_PREPARED}
    assert report["max-autotune-no-cudagraphs"]["why"].startswith(dispatch.BASELINE_PAST_END)
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    problem = dispatch.load_problem(VECTOR_ADD, "default")
    with pytest.raises(dispatch.DispatchError, match="the baseline 'max-autotune-no-cudagraphs' was not prepared in time: "
                                                     "its compile was still running at the step's end"):
        dispatch.measure(problem, slow, torch.device("cpu"), 2, until=time.time() + 0.5, end=time.time() + 1.0)


def test_a_measurement_whose_every_mode_raised_in_timing_keeps_the_baseline_saying_why(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """measure: a mode that ran and matched when prepared but raises in the timing rounds is left
    out as a variant that fails to run is (``prepared[MODE]``: not ok, why); with no mode left,
    the baseline is kept and the result says why."""
    real = dispatch.build

    def build(model: Any, mode: str) -> Any:
        fn = real(model, "eager")
        if mode == "eager":
            return fn
        calls = {"n": 0}

        def later_raises(*xs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] > 1:  # its first call, the preparation's, runs
                raise AssertionError("len(node.tensor_weakrefs) == len(node.stack_traces)")
            return fn(*xs)

        return later_raises

    monkeypatch.setattr(dispatch, "build", build)
    problem = dispatch.load_problem(VECTOR_ADD, "default")
    r = dispatch.measure(problem, ["eager", "default"], torch.device("cpu"), 2)
    why = "raised in a timing round: AssertionError: len(node.tensor_weakrefs) == len(node.stack_traces)"
    assert r["prepared"]["default"]["ok"] is False and r["prepared"]["default"]["why"] == why, r["prepared"]
    assert (r["winner"], r["fallback"], r["modes"]) == ("eager", True, {})
    assert r["why"] == f"every mode besides the baseline raised in a timing round: default: {why}"


def test_a_bounded_step_prepares_what_fits_first_and_the_autotuning_compiles_last(
        monkeypatch: pytest.MonkeyPatch) -> None:
    built: List[str] = []
    real = dispatch.build

    def build(model: Any, mode: str) -> Any:
        built.append(mode)
        return real(model, "eager")

    monkeypatch.setattr(dispatch, "build", build)
    problem = dispatch.load_problem(VECTOR_ADD, "default")
    modes = ["default", "max-autotune-no-cudagraphs", "eager", "default+freezing", "default+coordinate-descent"]
    dispatch.measure(problem, modes, torch.device("cpu"), 2, until=time.time() + 600.0)
    assert built == ["default", "eager", "default+freezing", "max-autotune-no-cudagraphs", "default+coordinate-descent"]
    built.clear()
    dispatch.measure(problem, modes, torch.device("cpu"), 2)  # unbounded: in the order given
    assert built == modes
    assert [dispatch.compile_class(v) for v in ("eager~rewrite", "reduce-overhead", "max-autotune+freezing",
                                                "default+freezing+max-autotune-pointwise",
                                                "max-autotune+max-autotune-pointwise",
                                                "max-autotune-no-cudagraphs+coordinate-descent")] == [0, 1, 2, 2, 3, 3]
    # A max-autotune mode that autotunes more besides goes after every other knob variant of it
    # (session 32: level3/004's max-autotune+max-autotune-pointwise ran 482 s and cut
    # max-autotune+no-epilogue-fusion, prepared after it).
    built.clear()
    modes = ["max-autotune-no-cudagraphs", "max-autotune-no-cudagraphs+max-autotune-pointwise",
             "max-autotune-no-cudagraphs+no-epilogue-fusion", "default", "eager"]
    dispatch.measure(problem, modes, torch.device("cpu"), 2, until=time.time() + 600.0)
    assert built == ["max-autotune-no-cudagraphs", "eager", "default", "max-autotune-no-cudagraphs+no-epilogue-fusion",
                     "max-autotune-no-cudagraphs+max-autotune-pointwise"]
    assert all(dispatch.autotunes(m) for m in modes[:3]) and not any(dispatch.autotunes(m) for m in modes[3:])


def test_a_deadline_that_comes_between_two_variants_is_taken_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The alarm may come anywhere in the preparation's block: after a variant was ready (here
    while its line is written) it stays ready, and the variants after it are not prepared."""
    real_say = dispatch.say

    def say(line: str) -> None:
        real_say(line)
        if line.startswith("prepared eager"):
            raise dispatch.StepDeadline()

    monkeypatch.setattr(dispatch, "say", say)
    real_build = dispatch.build
    monkeypatch.setattr(dispatch, "build", lambda model, mode: real_build(model, "eager"))  # no compiles
    ref = dispatch.reference(dispatch.load_problem(VECTOR_ADD, "default"), torch.device("cpu"))
    modes = ["default", "eager", "default+freezing", "max-autotune-no-cudagraphs"]
    ready, report = dispatch.prepare_modes(ref, modes, torch.device("cpu"), until=time.time() + 600.0)
    assert sorted(ready) == ["default", "eager"]
    for mode in modes[2:]:
        assert report[mode] == {"ok": False, "not_prepared": dispatch.NOT_PREPARED}, report


def test_timing_rounds_past_the_first_two_stop_at_the_steps_end(round_clock: Callable[[Any], Any]) -> None:
    clock = round_clock(dispatch)  # each round takes 10 s
    problem = dispatch.load_problem(VECTOR_ADD, "default")
    fns = {"eager": lambda *xs: None, "default": lambda *xs: None}
    # Warm-up and two rounds run although the end comes after the first; then none would fit.
    out = dispatch.time_rounds(problem, fns, "eager", torch.device("cpu"), 5, end=clock.now + 15.0)
    assert len(out["default"]) == dispatch.MIN_ROUNDS == 2 and clock.now == 1030.0
    # Room for two more rounds: four timed.
    out = dispatch.time_rounds(problem, fns, "eager", torch.device("cpu"), 5, end=clock.now + 50.0)
    assert len(out["default"]) == 4
    out = dispatch.time_rounds(problem, fns, "eager", torch.device("cpu"), 5)
    assert len(out["default"]) == 5


def test_bad_input_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "r.json")
    no_model = tmp_path / "no_model.py"
    no_model.write_text("def get_inputs():\n    return []\n\ndef get_init_inputs():\n    return []\n")
    base = ["--out", out, "--device", "cpu", "--baseline", "eager"]
    for argv, why in (
        ([str(tmp_path / "missing.py"), "--modes", "eager,default"], "no such file"),
        ([str(no_model), "--modes", "eager,default"], "no Model"),
        ([VECTOR_ADD, "--modes", "eager,warp-speed"], "unknown mode 'warp-speed'"),
        ([VECTOR_ADD, "--modes", "eager,default", "--rounds", "1"], "--rounds must be at least 2"),
        ([VECTOR_ADD, "--modes", "eager,default", "--size", "large"], "no LARGE dict"),
        ([VECTOR_ADD, "--modes", "eager,default", "--prepare-until", "2000", "--until", "1000"],
         "comes before --prepare-until"),
    ):
        assert dispatch.main(argv + base) == 2
        assert why in capsys.readouterr().err
        assert not os.path.exists(out)


def test_eager_against_inductor_on_the_cpu_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real compile with Inductor's CPU backend, timed against eager in interleaved rounds; the
    result names the winner consistently with the intervals and records the versions."""
    monkeypatch.setenv("KFORGE_SOCKET", str(tmp_path / "no-daemon.sock"))
    out = tmp_path / "r.json"
    with pytest.warns(Warning):  # no daemon: regions are not exclusive
        rc = dispatch.main([VECTOR_ADD, "--out", str(out), "--device", "cpu", "--modes", "eager,default",
                            "--baseline", "eager", "--rounds", "3"])
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["agent"] == "dispatch" and r["baseline"] == "eager" and r["versions"]["torch"] == torch.__version__
    assert r["tf32"] == {"cudnn": False, "cublas": False}  # strict fp32 whatever torch defaults to
    assert r["prepared"]["eager"]["ok"] and r["prepared"]["default"]["ok"], r["prepared"]
    m = r["modes"]["default"]
    assert len(m["per_round"]) == 3 and all(x["mode_ms"] > 0 for x in m["per_round"])
    assert m["ci95"][0] <= m["speedup"] <= m["ci95"][1]
    assert r["winner"] == ("default" if m["beyond_noise"] else "eager")
    assert r["fallback"] is (not m["beyond_noise"])


DIAG_SCALE = str(REPO / "tests" / "candidates" / "problems" / "diag_scale.py")
ROW_SOFTMAX = str(REPO / "tests" / "candidates" / "problems" / "row_softmax.py")


def measure_rewrite(tmp_path: Path, problem: str, *extra: str, classes: str = "exact,reassociates") -> Any:
    out = tmp_path / "r.json"
    with warnings.catch_warnings():  # no daemon: regions are not exclusive (when anything is timed)
        warnings.simplefilter("ignore")
        rc = dispatch.main([problem, "--out", str(out), "--device", "cpu", "--baseline", "default", "--rewrite", classes,
                            "--rounds", "2", *extra])
    assert rc == 0
    return json.loads(out.read_text())


def test_the_rewrite_agents_variants_are_measured_beside_the_modes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rule fires (diag-matmul): the rewritten forward, eager and in the baseline's mode, is
    prepared, compared with eager's output and timed in the same rounds against the same
    baseline; each variant names its rules and class; what the rewrite introduced is recorded."""
    monkeypatch.setenv("KFORGE_SOCKET", str(tmp_path / "no-daemon.sock"))
    r = measure_rewrite(tmp_path, DIAG_SCALE, "--modes", "eager")
    assert set(r["modes"]) == {"eager", "eager~rewrite", "default~rewrite"}, r["modes"].keys()
    for variant in ("eager~rewrite", "default~rewrite"):
        p = r["prepared"][variant]
        assert p["ok"] and p["rules"] == ["diag-matmul"] and p["exactness"] == "exact", p
        rows = r["modes"][variant]["per_round"]
        assert len(rows) == 2 and all(x["mode_ms"] > 0 for x in rows)
    assert r["prepared"]["eager~rewrite"]["max_abs_diff"] == 0.0  # exact: bit for bit, eagerly
    # The baseline's times are the round's, shared by every variant (the same interleaved rounds).
    assert [x["baseline_ms"] for x in r["modes"]["eager~rewrite"]["per_round"]] == \
        [x["baseline_ms"] for x in r["modes"]["eager"]["per_round"]]
    rw = r["rewrite"]
    assert rw["fired"] and rw["classes"] == ["exact", "reassociates"] and rw["exactness"] == "exact"
    assert [c["rule"] for c in rw["rules"]] == ["diag-matmul"]
    # diag(a) @ b dispatches diag_embed + mm; a.unsqueeze(-1) * b: unsqueeze + mul (FLOPs torch counts: none).
    assert (rw["introduced_ops"], rw["introduced_torch_calls"], rw["analytic_flops"]) == (["mul", "unsqueeze"], [], 0)


def order_of_preparation(monkeypatch: pytest.MonkeyPatch) -> List[str]:
    """What the measure step prepares, in order: each compile's mode and the rewrite agent's
    start (``REWRITE``); every compile is eager's (quick, exact)."""
    built: List[str] = []
    real_build, real_rewrite = dispatch.build, dispatch.prepare_rewrite
    monkeypatch.setattr(dispatch, "build", lambda model, mode: built.append(mode) or real_build(model, "eager"))

    def prepare_rewrite(*args: Any, **kw: Any) -> Any:
        built.append("REWRITE")
        return real_rewrite(*args, **kw)

    monkeypatch.setattr(dispatch, "prepare_rewrite", prepare_rewrite)
    return built


def test_a_bounded_step_prepares_the_rewrite_before_the_autotuning_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """At the large preset a max-autotune compile outlasted the bounded step and left the rewrite
    out (a decoder layer's attention-sdpa, 1.108x at the default preset): a bounded step prepares
    the rewrite before the compiles that autotune, whatever its baseline."""
    built = order_of_preparation(monkeypatch)
    problem = dispatch.load_problem(DIAG_SCALE, "default")
    modes = ["default", "max-autotune-no-cudagraphs", "eager", "default+coordinate-descent"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = dispatch.measure(problem, modes, torch.device("cpu"), 2, ["exact"], until=time.time() + 600.0)
    assert built == ["default", "eager", "REWRITE", "eager", "default", "max-autotune-no-cudagraphs",
                     "default+coordinate-descent"], built
    assert r["rewrite"]["fired"] and {"eager~rewrite", "default~rewrite"} <= set(r["modes"]), r["modes"].keys()
    built.clear()  # unbounded: the rewrite after every mode, as before
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dispatch.measure(problem, modes, torch.device("cpu"), 2, ["exact"])
    assert built == modes + ["REWRITE", "eager", "default"], built
    built.clear()  # against an autotuning baseline too (its BASELINE~rewrite autotunes): before the knobs
    problem = dispatch.load_problem(DIAG_SCALE, "default")
    other = "max-autotune"  # another autotuning variant
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = dispatch.measure(problem, ["max-autotune-no-cudagraphs", other, "default", "eager"], torch.device("cpu"), 2,
                             ["exact"], until=time.time() + 600.0)
    assert built == ["max-autotune-no-cudagraphs", "eager", "default", "REWRITE", "eager",
                     "max-autotune-no-cudagraphs", other], built
    assert {"eager~rewrite", "max-autotune-no-cudagraphs~rewrite"} <= set(r["prepared"]), r["prepared"].keys()


def test_the_rewrite_is_expected_to_take_one_baseline_compile_and_eagers_first_call() -> None:
    """``eager~rewrite`` compiles nothing: eager's first call where eager was prepared, else the
    baseline's again (cautious); ``BASELINE~rewrite`` one compile of the baseline's mode."""
    report = {"max-autotune": {"ok": True, "first_call_s": 120.0}, "eager": {"ok": True, "first_call_s": 0.5}}
    assert dispatch.rewrite_expected_s(report, "max-autotune") == pytest.approx(120.5)
    del report["eager"]
    assert dispatch.rewrite_expected_s(report, "max-autotune") == pytest.approx(240.0)
    assert dispatch.rewrite_expected_s({}, "default") == 0.0  # nothing known: it is tried
    assert dispatch.rewrite_expected_s({"eager": {"first_call_s": 0.2}}, "eager") == pytest.approx(0.2)
    assert dispatch.eager_rewrite_expected_s({"max-autotune": {"first_call_s": 9.0}}, "max-autotune") == 9.0


def test_a_rewrite_that_would_end_past_the_deadline_is_cut_to_its_eager_variant_or_left_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The early rewrite asks the step's clock with its expected time: both variants when they
    fit; ``eager~rewrite`` alone when only it fits (eager~rewrite won level-2 007 and level-3
    002 at the default preset); else no rule runs and nothing is proposed (the run says ``the
    rewrite`` was not prepared)."""
    ran: List[str] = []
    monkeypatch.setattr(dispatch, "prepare_rewrite", lambda *a, modes: ran.append(",".join(modes)) or {"fired": True})
    asked: List[float] = []

    def late(ahead: float) -> bool:
        asked.append(ahead)
        return ahead > 100.0

    step = dispatch.RewriteStep(None, None, "max-autotune", ["exact"], torch.device("cpu"), late)
    ready: Dict[str, Any] = {"max-autotune": object()}
    report = {"max-autotune": {"ok": True, "first_call_s": 60.0}, "eager": {"ok": True, "first_call_s": 1.0}}
    assert step.run(ready, report) == {"fired": True} and ran == ["eager,max-autotune"] and step.left_out is None
    # Both would end past the deadline, eager~rewrite alone would not: it alone (it compiles nothing).
    report["max-autotune"]["first_call_s"] = 150.0
    assert step.run(ready, report) == {"fired": True} and ran[-1] == "eager" and step.left_out == "max-autotune~rewrite"
    assert asked[-2:] == [pytest.approx(151.0), pytest.approx(1.0)]
    # Without eager prepared its time is guessed at the baseline's: nothing fits, no rule runs.
    del report["eager"]
    ran.clear()
    assert step.run(ready, report) is None and ran == []


def test_a_deadline_during_an_early_rewrite_leaves_it_and_the_autotuning_compiles_out(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The step's deadline comes while the rewrite is prepared: none of its variants is timed
    (a half-prepared rewrite has no proposal to ship), and the autotuning compiles after it are
    not prepared; what was prepared before it is timed."""
    real = dispatch.prepare_rewrite

    def prepare_rewrite(*args: Any, **kw: Any) -> Any:
        real(*args, **kw)  # its variants prepared, then the alarm
        raise dispatch.StepDeadline()

    monkeypatch.setattr(dispatch, "prepare_rewrite", prepare_rewrite)
    real_build = dispatch.build
    monkeypatch.setattr(dispatch, "build", lambda model, mode: real_build(model, "eager"))
    problem = dispatch.load_problem(DIAG_SCALE, "default")
    modes = ["default", "eager", "max-autotune-no-cudagraphs"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = dispatch.measure(problem, modes, torch.device("cpu"), 2, ["exact"], until=time.time() + 600.0)
    assert r["rewrite"] is None and not any("~" in v for v in list(r["prepared"]) + list(r["modes"])), r["prepared"]
    assert r["prepared"]["max-autotune-no-cudagraphs"] == {"ok": False, "not_prepared": dispatch.NOT_PREPARED}
    assert r["not_prepared"] == ["max-autotune-no-cudagraphs", "the rewrite"]
    assert set(r["modes"]) == {"eager"}, "what was prepared before the deadline is timed"


def test_no_rule_fired_means_the_rewrite_agent_proposes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFORGE_SOCKET", str(tmp_path / "no-daemon.sock"))
    r = measure_rewrite(tmp_path, ROW_SOFTMAX, "--modes", "")  # the rewrite agent alone: the baseline is enough
    assert r["rewrite"]["fired"] is False and "no rule fired" in r["rewrite"]["why"], r["rewrite"]
    assert (r["winner"], r["fallback"], r["modes"]) == ("default", True, {})
    assert "rewrite: no rule fired" in r["why"] and not any("~" in v for v in r["prepared"])
    # The classes the agent may use decide which rules it has: diag-matmul is exact.
    r = measure_rewrite(tmp_path, DIAG_SCALE, "--modes", "", classes="reassociates")
    assert r["rewrite"]["fired"] is False and r["rewrite"]["classes"] == ["reassociates"]


def test_rewrite_classes_are_a_closed_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "r.json")
    for classes, why in (("exact,sloppy", "unknown exactness class 'sloppy'"), (" , ", "no exactness class named")):
        assert dispatch.main([DIAG_SCALE, "--out", out, "--device", "cpu", "--baseline", "default", "--modes", "eager",
                              "--rewrite", classes]) == 2
        assert why in capsys.readouterr().err and not os.path.exists(out)
    # Without the rewrite agent the baseline alone is still nothing to compare.
    with pytest.raises(dispatch.DispatchError, match="nothing to compare"):
        dispatch.parse_modes("", "default", "cpu")
    assert dispatch.parse_modes("", "default", "cpu", rewrite=True) == ["default"]


def test_a_rewrite_that_cannot_be_measured_says_why_and_the_rest_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = dispatch.load_problem(DIAG_SCALE, "default")

    def broken(*args: Any) -> Any:
        raise RuntimeError("the flop counter exploded")

    monkeypatch.setattr(dispatch, "introduced", broken)
    r = dispatch.measure(problem, ["eager"], torch.device("cpu"), 2, ["exact"])
    assert r["rewrite"]["fired"] is False and "cannot be shipped: RuntimeError: the flop counter exploded" in r["rewrite"]["why"]
    assert (r["winner"], r["fallback"]) == ("eager", True) and list(r["prepared"]) == ["eager"]

    def rule_bug(*args: Any) -> Any:
        raise dispatch.RuleError("diag-matmul", "the replacement of matmul is ((96,), 'torch.float32')")

    monkeypatch.setattr(dispatch, "rewrite_model", rule_bug)
    r = dispatch.measure(problem, ["eager"], torch.device("cpu"), 2, ["exact"])
    assert "a rule failed (a bug in the rule): rule diag-matmul" in r["rewrite"]["why"]
    assert r["rewrite"]["failed_rules"][0] == "rule diag-matmul: the replacement of matmul is ((96,), 'torch.float32')"

    # One rule failing leaves the others' rewrites: made again without it.
    real = rw.rewrite_model

    def one_rule_bug(model: Any, xs: Any, rules: Any) -> Any:
        if any(rule.name == "linear-sum" for rule in rules):
            raise dispatch.RuleError("linear-sum", "the rewritten graph does not run: a stride")
        return real(model, xs, rules)

    monkeypatch.setattr(dispatch, "rewrite_model", one_rule_bug)
    monkeypatch.setattr(dispatch, "introduced", rw.introduced)
    r = dispatch.measure(problem, ["eager"], torch.device("cpu"), 2, ["exact", "reassociates"])
    assert r["rewrite"]["fired"] and [c["rule"] for c in r["rewrite"]["rules"]] == ["diag-matmul"], r["rewrite"]
    assert r["rewrite"]["failed_rules"] == ["rule linear-sum: the rewritten graph does not run: a stride"]


CANCELLING = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """(1e4 x + 1) - 1e4 x: 1 exactly in fp64, off by up to half an ulp of 1e4 in fp32."""

    def forward(self, x):
        return (x * 1e4 + 1.0) - x * 1e4


def get_inputs():
    return [torch.randn(64, 1024)]


def get_init_inputs():
    return []
'''


def test_a_variant_beyond_eagers_tolerance_is_judged_by_the_fp64_rule(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager's fp32 answer is itself off by ~5e-4 here: a variant with the exact answer differs
    from eager beyond 1e-4 yet is more accurate (kept, the rule named); one off by 0.1 is wrong."""
    real = dispatch.build

    def build(model: Any, mode: str) -> Any:
        if mode == "default":
            return lambda x: torch.ones_like(x)  # exact
        if mode == "max-autotune-no-cudagraphs":
            return lambda x: torch.ones_like(x) + 0.1  # wrong
        return real(model, mode)

    path = tmp_path / "cancelling.py"
    path.write_text(CANCELLING)
    monkeypatch.setattr(dispatch, "build", build)
    problem = dispatch.load_problem(str(path), "default")
    r = dispatch.measure(problem, ["eager", "default", "max-autotune-no-cudagraphs"], torch.device("cpu"), 2)
    exact, wrong = r["prepared"]["default"], r["prepared"]["max-autotune-no-cudagraphs"]
    assert exact["ok"] is True and exact["rule"] == "fp64-ratio" and exact["rho"] < 1.0
    assert "beyond rtol" in exact["beyond_tolerance"] and exact["d_ref"] > 1e-4
    assert wrong["ok"] is False and "the fp64 rule fails too" in wrong["why"] and wrong["rho"] > 10
    assert "default" in r["modes"] and "max-autotune-no-cudagraphs" not in r["modes"]


def test_more_variants_than_dynamos_recompile_limit_all_compile() -> None:
    """Every variant compiles the same forward with a backend of its own: past Dynamo's limit (8)
    the rest would run eagerly under their names; inside room_to_compile each one compiles."""

    def forward(x: Any) -> Any:
        return x + 1

    def run(n: int) -> List[int]:
        torch._dynamo.reset()
        called: List[int] = []

        def backend_for(i: int) -> Any:
            def backend(gm: Any, example_inputs: Any) -> Any:
                called.append(i)
                return gm.forward
            return backend

        x = torch.ones(3)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for i in range(n):
                assert torch.equal(torch.compile(forward, backend=backend_for(i))(x), x + 1)
        return called

    limit = torch._dynamo.config.recompile_limit
    assert len(run(limit + 3)) == limit  # the limit bites without it
    with dispatch.room_to_compile(limit + 3):
        assert run(limit + 3) == list(range(limit + 3))
    assert torch._dynamo.config.recompile_limit == limit  # put back
    torch._dynamo.reset()


def test_a_warmup_round_is_timed_first_and_not_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """time_rounds: WARMUP_ROUNDS rounds timed the same way before the counted ones, their
    samples dropped; the counted rounds are the ones asked for, in order."""
    seen: List[str] = []

    def bench(fns: List[Any], name: str, **kw: Any) -> List[List[float]]:
        seen.append(name)
        slow = 100.0 if name.endswith("warmup") else 1.0  # a warm-up would dominate if counted
        return [[slow * (i + 1)] * 3 for i in range(len(fns))]

    monkeypatch.setattr(dispatch, "do_bench_interleaved", bench)
    problem = dispatch.load_problem(VECTOR_ADD, "default")
    fns = {"eager": lambda *xs: None, "default": lambda *xs: None}
    out = dispatch.time_rounds(problem, fns, "eager", torch.device("cpu"), 3)
    assert dispatch.WARMUP_ROUNDS == 1
    assert seen == ["optimize:dispatch-warmup", "optimize:dispatch-round-0", "optimize:dispatch-round-1",
                    "optimize:dispatch-round-2"]
    assert out == {"default": [(1.0, pytest.approx(2.0), pytest.approx(3.0))] * 3}  # paired: m * exp(log(x / m))


def test_a_mode_that_raises_in_a_timing_round_is_left_out_and_the_round_run_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """time_rounds with ``failed``: a mode whose call raises in a round (CUDA graph trees'
    assertion at the large preset) is left out with its error, the round is run again without
    it, and the other modes keep every round; the baseline raising ends the step with its own
    error; without ``failed`` any error ends it."""
    seen: List[Tuple[str, int]] = []

    def bench(fns: List[Any], name: str, **kw: Any) -> List[List[float]]:
        seen.append((name, len(fns)))
        for f in fns:
            f()
        return [[float(i + 1)] * 3 for i in range(len(fns))]

    calls = {"n": 0}

    def flaky(*xs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # its second call: the first counted round (the first: the warm-up)
            raise AssertionError("len(node.tensor_weakrefs) == len(node.stack_traces)")

    monkeypatch.setattr(dispatch, "do_bench_interleaved", bench)
    problem = dispatch.load_problem(VECTOR_ADD, "default")
    fns = {"eager": lambda *xs: None, "reduce-overhead": flaky, "default": lambda *xs: None}
    failed: Dict[str, str] = {}
    out = dispatch.time_rounds(problem, fns, "eager", torch.device("cpu"), 2, failed=failed)
    assert failed == {"reduce-overhead": "raised in a timing round: AssertionError: "
                                         "len(node.tensor_weakrefs) == len(node.stack_traces)"}
    assert out == {"default": [(1.0, pytest.approx(2.0), pytest.approx(3.0))] * 2}, "every round of the others, the failed one's none"
    assert seen == [("optimize:dispatch-warmup", 4), ("optimize:dispatch-round-0", 4),
                    ("optimize:dispatch-round-0", 3), ("optimize:dispatch-round-1", 3)]

    def broken(*xs: Any) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        dispatch.time_rounds(problem, {"eager": broken, "default": lambda *xs: None}, "eager",
                             torch.device("cpu"), 2, failed={})
    calls["n"] = 0
    with pytest.raises(AssertionError, match="tensor_weakrefs"):
        dispatch.time_rounds(problem, {"eager": lambda *xs: None, "reduce-overhead": flaky}, "eager",
                             torch.device("cpu"), 2)


def test_a_baseline_that_raises_inside_cuda_graph_trees_resets_them_once(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """time_rounds with ``failed``: the baseline raising inside torch's CUDA graph trees
    (``cudagraph_trees.py`` in its traceback) resets the trees, times a warm-up round and the
    round again, every mode kept; a second such error, or one raised elsewhere, ends the step."""
    trees = tmp_path / "cudagraph_trees.py"
    trees.write_text("def dealloc():\n    raise AssertionError('len(node.tensor_weakrefs) == len(node.stack_traces)')\n")
    dealloc = runpy.run_path(str(trees))["dealloc"]  # its frames name cudagraph_trees.py
    seen: List[str] = []
    resets: List[int] = []

    def bench(fns: List[Any], name: str, **kw: Any) -> List[List[float]]:
        seen.append(name)
        for f in fns:
            f()
        return [[float(i + 1)] * 3 for i in range(len(fns))]

    monkeypatch.setattr(dispatch, "do_bench_interleaved", bench)
    monkeypatch.setattr(dispatch, "reset_graph_trees", lambda: resets.append(len(seen)))
    problem = dispatch.load_problem(VECTOR_ADD, "default")
    calls = {"n": 0}

    def baseline(*xs: Any) -> None:
        calls["n"] += 1
        if calls["n"] in raising:
            dealloc()

    raising = {3}  # the first counted round's first call (the warm-up: calls 1 and 2)
    fns = {"eager": baseline, "reduce-overhead": lambda *xs: None}
    failed: Dict[str, str] = {}
    out = dispatch.time_rounds(problem, fns, "eager", torch.device("cpu"), 2, failed=failed)
    assert resets == [2], "once, after the round that raised"
    assert seen == ["optimize:dispatch-warmup", "optimize:dispatch-round-0", "optimize:dispatch-warmup",
                    "optimize:dispatch-round-0", "optimize:dispatch-round-1"]
    assert failed == {} and out == {"reduce-overhead": [(1.0, pytest.approx(2.0), pytest.approx(3.0))] * 2}, "every mode, every round"
    # Raised in the warm-up round itself: the trees reset, that warm-up once more, then the
    # counted rounds (not a second warm-up).
    seen.clear()
    resets.clear()
    calls["n"], raising = 0, {1}
    out = dispatch.time_rounds(problem, fns, "eager", torch.device("cpu"), 2, failed=failed)
    assert resets == [1] and seen == ["optimize:dispatch-warmup", "optimize:dispatch-warmup",
                                      "optimize:dispatch-round-0", "optimize:dispatch-round-1"]
    assert failed == {} and out == {"reduce-overhead": [(1.0, pytest.approx(2.0), pytest.approx(3.0))] * 2}
    # Again after the reset (torch's own second error: the shut-down manager): the step ends,
    # with the first error, the second in its notes.
    trees.write_text("def dealloc():\n    raise AssertionError('len(node.tensor_weakrefs) == len(node.stack_traces)')\n"
                     "def shutdown():\n    raise AssertionError('Running CUDAGraph after shutdown')\n")
    shutdown = runpy.run_path(str(trees))["shutdown"]

    def baseline_then_shutdown(*xs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            dealloc()
        if calls["n"] == 5:
            shutdown()

    calls["n"] = 0
    with pytest.raises(AssertionError, match="tensor_weakrefs") as raised:
        dispatch.time_rounds(problem, {"eager": baseline_then_shutdown, "reduce-overhead": lambda *xs: None},
                             "eager", torch.device("cpu"), 2, failed={})
    assert any("after the trees were reset, the warm-up round raised again" in n and "after shutdown" in n
               for n in getattr(raised.value, "__notes__", [])), raised.value

    def elsewhere(*xs: Any) -> None:
        raise AssertionError("len(node.tensor_weakrefs) == len(node.stack_traces)")  # not in the trees' file

    resets.clear()
    with pytest.raises(AssertionError, match="tensor_weakrefs"):
        dispatch.time_rounds(problem, {"eager": elsewhere, "default": lambda *xs: None}, "eager",
                             torch.device("cpu"), 2, failed={})
    assert resets == []


def test_a_round_timed_in_a_tainted_region_is_timed_again_a_bounded_number_of_times(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """time_rounds: a counted round whose region was not exclusive (tainted) is timed again, at
    most TAINTED_RETAKES times in a step; later tainted rounds are kept, and ``taint`` counts
    both; a tainted warm-up round is not timed again."""
    tainted_calls = {2, 3, 4, 6}  # bench calls (1-based): 1 the warm-up; 2 and 3 round 1 retaken
    seen: List[str] = []

    class Held:
        def __init__(self, tainted: bool) -> None:
            self.tainted = tainted

    def bench(fns: List[Any], name: str, regions: Optional[List[Any]] = None, **kw: Any) -> List[List[float]]:
        seen.append(name)
        assert regions is not None, "time_rounds asks for the region"
        regions.append(Held(len(seen) in tainted_calls or len(seen) == 1))
        return [[float(len(seen) * 10 + i)] for i in range(len(fns))]

    monkeypatch.setattr(dispatch, "do_bench_interleaved", bench)
    problem = dispatch.load_problem(VECTOR_ADD, "default")
    fns = {"eager": lambda *xs: None, "default": lambda *xs: None}
    taint: Dict[str, int] = {}
    out = dispatch.time_rounds(problem, fns, "eager", torch.device("cpu"), 3, taint=taint)
    assert dispatch.TAINTED_RETAKES == 2
    assert taint == {"retaken": 2, "kept": 2}, "calls 2 and 3 retaken; 4 and 6 kept"
    assert seen == ["optimize:dispatch-warmup"] + ["optimize:dispatch-round-0"] * 3 + [
        "optimize:dispatch-round-1", "optimize:dispatch-round-2"]
    assert out == {"default": [pytest.approx((40.0, 41.0, 42.0)), pytest.approx((50.0, 51.0, 52.0)),
                               pytest.approx((60.0, 61.0, 62.0))]}


GRAPH_BREAK = str(REPO / "python" / "tests" / "fixtures" / "graphs" / "linear_hook_softmax.py")


def test_per_graph_plans_are_variants_checked_as_modes_are() -> None:
    """``graphs:M0/M1`` names a mode per graph; each must be a mode, none that needs a GPU on the
    CPU; a plan of one mode throughout is that mode."""
    assert dispatch.parse_modes("graphs:eager/default", "default", "cpu") == ["default", "graphs:eager/default"]
    assert dispatch.graph_plan("graphs:eager/max-autotune") == ["eager", "max-autotune"]
    assert dispatch.graph_plan("max-autotune") is None
    for text, why in (("graphs:eager/turbo", "'turbo' is not a mode"), ("graphs:", "'' is not a mode"),
                      ("graphs:eager/reduce-overhead", r"'reduce-overhead' \(in graphs:eager/reduce-overhead\) uses CUDA graphs")):
        with pytest.raises(dispatch.DispatchError, match=why):
            dispatch.parse_modes(text, "default", "cpu")
    assert dispatch.plan_name(["eager", "eager"]) == "eager"
    assert dispatch.plan_name(["eager", "default"]) == "graphs:eager/default"
    assert dispatch.neighbours(["default", "default"], ["default", "eager"], [3, 10]) == [
        ["default", "eager"], ["eager", "default"]]  # the larger graph first


def test_the_per_graph_search_moves_one_graph_at_a_time_to_the_fastest_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Coordinate descent on given times (each graph's cost per mode, a plan's the sum): from the
    per-problem winner it moves to the best plan one graph away that beats it in the same rounds,
    then stops when no neighbour does; the plan it ends with is the winner, with its timing."""
    cost = [{"eager": 1.0, "default": 2.0, "max-autotune-no-cudagraphs": 3.0},
            {"eager": 5.0, "default": 4.0, "max-autotune-no-cudagraphs": 2.0}]

    def plan_ms(variant: str) -> float:
        plan = dispatch.graph_plan(variant) or [variant, variant]
        return sum(cost[g][m] for g, m in enumerate(plan))

    def prepare_one(variant: str, model: Any, ref: Any, dev: Any, ready: Any, report: Any) -> None:
        ready[variant], report[variant] = variant, {"ok": True}

    def time_rounds(problem: Any, fns: Any, baseline: str, dev: Any, n: int) -> Any:
        jitter = [1.0, 1.002, 0.998, 1.001]
        return {m: [(plan_ms(baseline) * j, plan_ms(m) * j, plan_ms(baseline) * j * 1.0005) for j in jitter[:n]]
                for m in fns if m != baseline}

    monkeypatch.setattr(dispatch, "prepare_one", prepare_one)
    monkeypatch.setattr(dispatch, "time_rounds", time_rounds)
    fns = {m: m for m in ("default", "eager", "max-autotune-no-cudagraphs")}
    result = {"baseline": "default", "winner": "max-autotune-no-cudagraphs", "fallback": False,
              "modes": {"max-autotune-no-cudagraphs": {"speedup": 6 / 5}}}
    graphs = dispatch.Graphs(ops=[3, 10], breaks=["hook (m.py:1)"])
    ref = SimpleNamespace(model=None)  # prepare_one is given times here: no model is compiled
    info = dispatch.graph_search(None, ref, graphs, fns, result, None, 4, 3)  # type: ignore[arg-type]
    assert [r["from"] for r in info["rounds"]] == ["max-autotune-no-cudagraphs", "graphs:eager/max-autotune-no-cudagraphs"]
    assert [r["moved_to"] for r in info["rounds"]] == ["graphs:eager/max-autotune-no-cudagraphs", None]
    # Round 1 measured every plan one graph away, the larger graph's first (the modes in the order
    # they were prepared); plain modes are not measured again.
    assert list(info["rounds"][0]["prepared"]) == [
        "graphs:max-autotune-no-cudagraphs/default", "graphs:max-autotune-no-cudagraphs/eager",
        "graphs:default/max-autotune-no-cudagraphs", "graphs:eager/max-autotune-no-cudagraphs"]
    assert info["rounds"][0]["against_current"]["graphs:eager/max-autotune-no-cudagraphs"]["speedup"] == pytest.approx(5 / 3)
    assert info["plan"] == result["winner"] == "graphs:eager/max-autotune-no-cudagraphs" and not result["fallback"]
    assert result["modes"][result["winner"]]["speedup"] == pytest.approx(6 / 3)
    # A fallback (the baseline won) is searched from the baseline's plan; one graph is not searched at all.
    kept = {"baseline": "eager", "winner": "eager", "fallback": True, "modes": {}}
    fns_eager = {"eager": "eager", "default": "default"}
    cost[0]["default"], cost[1]["default"] = 0.5, 9.0
    info = dispatch.graph_search(None, ref, graphs, fns_eager, kept, None, 4, 2)  # type: ignore[arg-type]
    assert (kept["winner"], kept["fallback"]) == ("graphs:default/eager", False), info
    one = dispatch.graph_search(None, ref, dispatch.Graphs([4], []), fns, dict(result), None, 4, 2)  # type: ignore[arg-type]
    assert "one graph" in one["why"] and one["rounds"] == []


def test_a_forward_of_two_graphs_is_searched_per_graph_on_the_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end with Inductor's CPU backend: explain finds the two graphs and the break; every
    plan one graph away is compiled with the per-graph backend, matches eager and is timed; the
    winner is consistent with what the rounds found."""
    monkeypatch.setenv("KFORGE_SOCKET", str(tmp_path / "no-daemon.sock"))
    out = tmp_path / "r.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = dispatch.main([GRAPH_BREAK, "--out", str(out), "--device", "cpu", "--modes", "eager,default",
                            "--baseline", "default", "--rounds", "2", "--graph-rounds", "1"])
    assert rc == 0
    r = json.loads(out.read_text())
    g = r["graphs"]
    assert (g["count"], len(g["breaks"])) == (2, 1) and "disable" in g["breaks"][0], g
    assert "linear_hook_softmax.py:" in g["breaks"][0]
    (only,) = g["rounds"]
    assert set(only["prepared"]) == {"graphs:eager/default", "graphs:default/eager"}, only["prepared"]
    assert all(p["ok"] and p["max_abs_diff"] <= 1e-5 for p in only["prepared"].values()), only["prepared"]
    assert all(len(v["per_round"]) == 2 for v in only["modes"].values())
    moved = only["moved_to"]
    assert g["plan"] == (moved or r["winner"])
    if moved is not None:
        assert r["winner"] == moved and r["modes"][moved]["beyond_noise"]


def test_a_forward_of_one_graph_has_no_per_graph_search(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KFORGE_SOCKET", str(tmp_path / "no-daemon.sock"))
    out = tmp_path / "r.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert dispatch.main([VECTOR_ADD, "--out", str(out), "--device", "cpu", "--modes", "eager,default",
                              "--baseline", "eager", "--rounds", "2", "--graph-rounds", "2"]) == 0
    g = json.loads(out.read_text())["graphs"]
    assert (g["count"], g["breaks"], g["rounds"]) == (1, [], []) and "one graph" in g["why"], g


def test_a_negative_number_of_graph_rounds_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dispatch.main([VECTOR_ADD, "--out", str(tmp_path / "r.json"), "--device", "cpu", "--modes", "eager,default",
                          "--graph-rounds", "-1"]) == 2
    assert "--graph-rounds must be 0 (off) or more, got -1" in capsys.readouterr().err


def test_a_variant_that_compiles_as_another_is_not_measured_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Max-autotune already sets coordinate_descent_tuning: its coordinate-descent knob compiles
    exactly as the baseline does, so it is a duplicate; against default it is not. The
    measurement names the duplicate and neither prepares nor times it."""
    every = ",".join(dispatch.KNOBS)
    on_max = dispatch.parse_modes("eager,default,max-autotune-no-cudagraphs", "max-autotune", "cuda", every)
    assert dispatch.duplicates(on_max) == {"max-autotune+coordinate-descent": "max-autotune"}
    on_default = dispatch.parse_modes("eager,max-autotune", "default", "cuda", every)
    assert dispatch.duplicates(on_default) == {}
    # Knobs in another order are the same options; a rewrite or a per-graph plan is not compared.
    assert dispatch.duplicates(["default", "default+freezing+aggressive-fusion", "default+aggressive-fusion+freezing",
                                "eager~rewrite", "default~rewrite", "graphs:eager/default"]) == {
        "default+aggressive-fusion+freezing": "default+freezing+aggressive-fusion"}
    monkeypatch.setenv("KFORGE_SOCKET", str(tmp_path / "no-daemon.sock"))
    out = tmp_path / "r.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert dispatch.main([VECTOR_ADD, "--out", str(out), "--device", "cpu", "--modes", "eager",
                              "--baseline", "default", "--knobs", "freezing+aggressive-fusion,aggressive-fusion+freezing",
                              "--rounds", "2"]) == 2  # named twice: parse_modes refuses the same set
        assert dispatch.main([VECTOR_ADD, "--out", str(out), "--device", "cpu", "--modes", "eager,max-autotune-no-cudagraphs",
                              "--baseline", "max-autotune", "--knobs", "coordinate-descent", "--rounds", "2"]) == 0
    r = json.loads(out.read_text())
    assert r["duplicates"] == {"max-autotune+coordinate-descent": "max-autotune"}, r["duplicates"]
    assert "max-autotune+coordinate-descent" not in r["prepared"] and "max-autotune+coordinate-descent" not in r["modes"]


def test_the_baselines_profile_gives_the_triton_share_or_why_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inductor's Triton kernels by their names' prefix against all device work; on the CPU, or
    when the profile fails, a reason instead (the measurement stands either way)."""
    assert "CPU" in dispatch.baseline_profile(lambda *xs: None, [], torch.device("cpu"))["why"]
    cuda = SimpleNamespace(type="cuda")
    monkeypatch.setattr(dispatch, "device_us", lambda fn, xs, calls, name: {
        "triton_poi_fused_add_0": 30.0, "triton_tem_fused_mm_1": 10.0, "void at::native::copy_kernel": 60.0})
    assert dispatch.baseline_profile(lambda *xs: None, [], cuda) == {"triton_share": pytest.approx(0.4), "device_us": 100.0}

    def fails(*a: Any) -> Any:
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    monkeypatch.setattr(dispatch, "device_us", fails)
    assert "the profile failed: RuntimeError: CUPTI" in dispatch.baseline_profile(lambda *xs: None, [], cuda)["why"]
    monkeypatch.setattr(dispatch, "device_us", lambda *a: {})
    assert dispatch.baseline_profile(lambda *xs: None, [], cuda) == {"why": "the profile saw no device work"}


def test_a_knob_that_changes_no_code_is_not_timed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A knob variant whose compile generated exactly the code of an earlier variant of its mode
    (the ``# AOT ID`` line aside) is that candidate again: prepared and judged, then named
    ``same_code_as`` that one and not timed. On a vector add, freezing (no weights) and aggressive fusion (one kernel) change
    nothing Inductor writes; a rewrite, a per-graph plan, a plain mode or an unprepared variant
    is never called the same."""
    codes = {"default": ("a",), "default+freezing": ("a",), "default+aggressive-fusion": ("b",), "eager": (),
             "max-autotune-no-cudagraphs": ("a",), "default~rewrite": ("a",), "default+no-epilogue-fusion": ("a",)}
    ready = {v: object() for v in codes if v != "default+no-epilogue-fusion"}
    assert dispatch.same_code(list(codes), codes, ready) == {"default+freezing": "default"}
    assert dispatch.same_code(["default+freezing"], {"default": (), "default+freezing": ()}, ready) == {}, "no code seen"
    # In the beam's round: a combination whose other knob changed nothing is the single knob again.
    # The beam lists its combinations first: the variant with fewer knobs stays, whatever the order.
    beam = {"default": ("a",), "default+freezing+aggressive-fusion": ("b",),
            "default+aggressive-fusion+no-epilogue-fusion": ("a",), "default+no-epilogue-fusion+freezing": ("c",),
            "default+freezing": ("b",), "default+aggressive-fusion": ("a",), "default+no-epilogue-fusion": ("d",)}
    assert dispatch.same_code(list(beam), beam, {v: object() for v in beam}) == {
        "default+aggressive-fusion": "default", "default+freezing+aggressive-fusion": "default+freezing",
        "default+aggressive-fusion+no-epilogue-fusion": "default"}
    # Only knobs whose every effect is in the generated code are compared.
    monkeypatch.setattr(dispatch, "SAME_CODE_KNOBS", frozenset({"aggressive-fusion"}))
    assert dispatch.same_code(list(beam), beam, {v: object() for v in beam}) == {"default+aggressive-fusion": "default"}
    monkeypatch.undo()
    monkeypatch.setenv("KFORGE_SOCKET", str(tmp_path / "no-daemon.sock"))
    out = tmp_path / "r.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert dispatch.main([VECTOR_ADD, "--out", str(out), "--device", "cpu", "--modes", "eager", "--baseline", "default",
                              "--knobs", "freezing,aggressive-fusion", "--rounds", "2"]) == 0
    r = json.loads(out.read_text())
    for knob in ("default+freezing", "default+aggressive-fusion"):
        assert r["prepared"][knob]["ok"] and r["prepared"][knob]["same_code_as"] == "default", r["prepared"]
        assert knob not in r["modes"]
    assert "eager" in r["modes"] and "same_code_as" not in r["prepared"]["eager"]
    # With nothing else to time, the fallback says why.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert dispatch.main([VECTOR_ADD, "--out", str(out), "--device", "cpu", "--modes", "", "--baseline", "default",
                              "--knobs", "freezing", "--rounds", "2"]) == 0
    r = json.loads(out.read_text())
    assert r["fallback"] and r["why"].endswith("not timed, generating the code of a variant with fewer knobs: default+freezing"), r


def test_generated_code_leaves_out_the_compile_number_and_sees_a_changed_kernel() -> None:
    """Two compiles of one forward generate the same code but for the ``# AOT ID`` line, and so
    hash the same; another computation hashes otherwise; eager loads no code."""
    import copy

    model = torch.nn.Linear(16, 16).eval()
    x = torch.randn(4, 16)
    with dispatch.room_to_compile(8):
        def call(options: Any, m: Any = model) -> Any:
            f = torch.compile(copy.deepcopy(m), options=options, dynamic=False)
            return lambda: f(x)

        with torch.no_grad():
            first = dispatch.generated_code(call({"aggressive_fusion": False}))
            second = dispatch.generated_code(call({"aggressive_fusion": True}))
            other = dispatch.generated_code(call({}, torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).eval()))
            assert dispatch.generated_code(lambda: model(x)) == ()
    assert len(first) == 1 and first == second, (first, second)
    assert other and other != first


def test_a_wrappers_digest_leaves_out_where_its_kernels_were_cached() -> None:
    """Two runs with their own Inductor caches generate the same wrapper but for the cache
    paths in its ``# kernel path`` comments (Triton kernels only, so not seen on the CPU) and
    the compile's number: the digest is the same; a changed kernel line changes it."""
    def wrapper(cache: str, aot: int, block: int) -> str:
        return "\n".join([f"# AOT ID: ['{aot}_inference']", "from torch import empty_strided",
                          f"# kernel path: {cache}/ab/cabc.py", "# Source Nodes: [relu]",
                          "triton_poi_fused_relu_0 = async_compile.triton(", f"    XBLOCK = {block}", ")"])
    cold, warm = wrapper("/tmp/run-a/cache", 0, 128), wrapper("/tmp/run-b/cache", 3, 128)
    assert cold != warm and dispatch.code_digest(cold) == dispatch.code_digest(warm)
    assert dispatch.code_digest(wrapper("/tmp/run-a/cache", 0, 256)) != dispatch.code_digest(cold)


def test_a_knob_with_no_op_to_act_on_is_not_compiled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Layout optimization acts only on convolutions and epilogue fusion only on templates
    (GEMMs, convolutions): on graphs without them those knobs change nothing, so their variants
    are not compiled (``no_effect``, with why). A graph with such an op, a knob outside
    ``KNOB_NEEDS``, a combination with another knob and unknown graphs are compiled as before."""
    adds = dispatch.Graphs([1], [], frozenset({"add"}))
    assert dispatch.no_effect("max-autotune+no-layout-optimization", adds) == (
        "no-layout-optimization: no convolution in the graphs, so no layout to optimize")
    assert dispatch.no_effect("max-autotune+no-layout-optimization+no-epilogue-fusion", adds) is not None
    convs = dispatch.Graphs([2], [], frozenset({"conv2d", "relu"}))
    linear = dispatch.Graphs([2], [], frozenset({"linear"}))
    assert dispatch.no_effect("max-autotune+no-layout-optimization", convs) is None
    assert dispatch.no_effect("max-autotune+no-epilogue-fusion", linear) is None
    assert dispatch.no_effect("max-autotune+no-epilogue-fusion", convs) is None, "a convolution is a template too"
    assert dispatch.no_effect("max-autotune+no-layout-optimization", linear) is not None
    assert dispatch.no_effect("max-autotune+freezing", adds) is None, "a knob outside KNOB_NEEDS"
    assert dispatch.no_effect("max-autotune+no-layout-optimization+freezing", adds) is None
    assert dispatch.no_effect("max-autotune+no-layout-optimization", None) is None, "graphs unknown"
    assert dispatch.no_effect("max-autotune", adds) is None
    opaque = dispatch.Graphs([1], [], frozenset({"add", dispatch.OPAQUE}))
    assert dispatch.no_effect("max-autotune+no-layout-optimization", opaque) is None, "a module of modules: anything"
    for name in ("lstmcell", "inner", "linalg_matrix_power", "cov", "scaled_dot_product_attention", "baddbmm"):
        assert dispatch.no_effect("max-autotune+no-epilogue-fusion", dispatch.Graphs([1], [], frozenset({name}))) is None
    # Ops in nested graphs (a checkpointed region) are seen.
    inner = torch.nn.Linear(4, 4)

    class Checkpointed(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            return torch.utils.checkpoint.checkpoint(lambda y: inner(y).relu(), x, use_reentrant=False) + 1

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        seen = dispatch.find_graphs(Checkpointed(), [torch.randn(2, 4, requires_grad=True)]).op_names
    assert "linear" in seen, seen
    monkeypatch.setenv("KFORGE_SOCKET", str(tmp_path / "no-daemon.sock"))
    out = tmp_path / "r.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert dispatch.main([VECTOR_ADD, "--out", str(out), "--device", "cpu", "--modes", "eager", "--baseline", "default",
                              "--knobs", "no-layout-optimization,no-epilogue-fusion", "--rounds", "2",
                              "--graph-rounds", "1"]) == 0
    r = json.loads(out.read_text())
    for knob, word in (("default+no-layout-optimization", "no convolution"), ("default+no-epilogue-fusion", "no GEMM")):
        assert r["prepared"][knob]["ok"] and word in r["prepared"][knob]["no_effect"], r["prepared"]
        assert "first_call_s" not in r["prepared"][knob] and knob not in r["modes"], "not compiled, not timed"


def test_compile_workers_warm_the_variants_the_step_then_prepares_from_the_cache(tmp_path: Path) -> None:
    """``--compile-workers 2``: two worker processes compile the knob variants into Inductor's FX
    graph cache (a fresh directory here) while the step compiles its baseline; each variant the
    step then prepares says what its worker did and that its compile was a cache hit. Eager is
    compiled by no one; the record says how many workers were asked for and started."""
    # A fresh process, as kforge optimize starts the step: this one's compiles and Inductor
    # settings of earlier tests would give its variants other cache keys than a fresh worker's.
    env = {**os.environ, "KFORGE_SOCKET": str(tmp_path / "no-daemon.sock"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "PYTHONPATH": str(REPO / "python")}
    out = tmp_path / "r.json"
    knobs = ("default+aggressive-fusion", "default+coordinate-descent")
    done = subprocess.run([sys.executable, "-m", "kforge.optimize.dispatch", VECTOR_ADD, "--out", str(out), "--device",
                           "cpu", "--modes", "eager", "--baseline", "default", "--knobs",
                           "aggressive-fusion,coordinate-descent", "--rounds", "2", "--compile-workers", "2"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    r = json.loads(out.read_text())
    assert r["compile_workers"] == {"asked": 2, "started": 2}, r.get("compile_workers")
    for knob in knobs:
        warmed = r["prepared"][knob]["warmed"]
        assert warmed["variant"] == knob and warmed["ok"] and warmed["seconds"] > 0, warmed
        assert warmed["cache_hit"], f"{knob}: the step's compile should load what its worker wrote: {warmed}"
    assert "warmed" not in r["prepared"]["default"] and "warmed" not in r["prepared"]["eager"], r["prepared"]


def test_compile_workers_are_dealt_the_variants_in_the_steps_order() -> None:
    """Workers get the variants round-robin (the first ones each compiles are the first the step
    needs), never eager, a per-graph plan or a rewrite; memory bounds how many start."""
    from kforge.optimize import warm

    variants = ["eager", "default", "max-autotune-no-cudagraphs", "max-autotune+freezing", "graphs:eager/default",
                "max-autotune~rewrite", "max-autotune+aggressive-fusion"]
    ok = [v for v in variants if warm.warmable(v)]
    assert ok == ["default", "max-autotune-no-cudagraphs", "max-autotune+freezing", "max-autotune+aggressive-fusion"]
    assert warm.shares(ok, 2) == [["default", "max-autotune+freezing"],
                                  ["max-autotune-no-cudagraphs", "max-autotune+aggressive-fusion"]]
    assert warm.shares(ok[:1], 3) == [["default"]], "no empty share"
    assert warm.shares(ok, 0) == []
    gib = 2**30
    assert warm.workers_for_memory(3, 1 * gib, 80 * gib) == 3
    assert warm.workers_for_memory(3, 6 * gib, 80 * gib) == 1, "40 GiB of the free 80 hold one at 4 x 6 GiB"
    assert warm.workers_for_memory(3, 20 * gib, 80 * gib) == 0
    assert warm.workers_for_memory(2, 0, 0) == 2, "no footprint measured (the CPU): not bounded"


def test_a_negative_number_of_compile_workers_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = dispatch.main([VECTOR_ADD, "--out", str(tmp_path / "r.json"), "--device", "cpu", "--compile-workers", "-1"])
    assert rc == 2
    assert "--compile-workers must be 0 (none) or more, got -1" in capsys.readouterr().err


def test_a_worker_that_exits_without_its_line_leaves_the_variant_to_the_step_and_stop_reaps_all(
        tmp_path: Path) -> None:
    """A worker that cannot run (here: no such problem file) exits without a line: ``wait`` then
    returns None (the step compiles the variant itself) instead of blocking. ``stop`` ends and
    reaps workers still starting."""
    from kforge.optimize import warm

    broken = warm.CompileWorkers(warm.WarmSpec(str(tmp_path / "missing.py"), "default", "cpu", 1), ["default"])
    assert broken.count == 1
    assert broken.wait("default") is None
    assert broken.wait("eager") is None, "no worker has eager"
    broken.stop()
    starting = warm.CompileWorkers(warm.WarmSpec(VECTOR_ADD, "default", "cpu", 2), ["default", "default+freezing"])
    with starting:
        assert starting.count == 2
    assert all(w.proc.returncode is not None for w in starting._workers), "reaped"


def test_a_silent_worker_is_given_up_at_the_deadline_and_a_stopped_one_is_asked_nothing(tmp_path: Path) -> None:
    """A worker that said one variant and then stays silent (a stuck compile): waiting for its
    next variant ends at the step's deadline with None (the step compiles it itself) and the
    worker is stopped; after ``stop`` every ``wait`` is None at once (the OOM retry's path), never
    a read of a closed pipe."""
    from kforge.optimize import warm

    fake = tmp_path / "fake-python"
    fake.write_text("#!/bin/sh\necho 'a library line'\n"
                    "echo '{\"variant\": \"default\", \"ok\": true, \"seconds\": 0.5}'\nexec sleep 300\n")
    fake.chmod(0o755)
    spec = warm.WarmSpec(VECTOR_ADD, "default", "cpu", 1)
    workers = warm.CompileWorkers(spec, ["default", "default+freezing"], python=str(fake))
    assert workers.wait("default") == {"variant": "default", "ok": True, "seconds": 0.5}
    assert workers.compiled("default") and not workers.compiled("eager"), "eager is no worker's"
    t0 = time.time()
    assert not workers.compiled("default+freezing"), "asked without waiting: the silent worker has not said it"
    assert time.time() - t0 < 0.5
    assert workers.wait("default+freezing", deadline=time.time() + 0.5) is None
    proc = workers._workers[0].proc
    assert proc.returncode is not None, "the silent worker was stopped"
    assert time.time() - t0 < 0.5 + warm.STOP_PATIENCE_S + 5
    workers.stop()
    assert workers.wait("default+freezing") is None and workers.wait("default") == {
        "variant": "default", "ok": True, "seconds": 0.5}, "what it said stays; nothing more is read"
    two = warm.CompileWorkers(warm.WarmSpec(VECTOR_ADD, "default", "cpu", 2), ["default", "default+freezing"],
                              python=str(fake))
    two.stop()
    assert two.wait("default+freezing") is None, "stopped: not a read of a closed pipe"


HELD_WORKER = """\
#!/bin/sh
printf '%s\\n' "$@" > LOG
if [ -p /dev/stdin ]; then echo 'stdin: a pipe' >> LOG; else echo 'stdin: not a pipe' >> LOG; fi
echo '{"variant": "default", "ok": true, "seconds": 0.5}'
read line
echo '{"variant": "max-autotune+freezing", "ok": true, "seconds": 2.0}'
"""


def test_held_compile_workers_compile_their_autotuning_variants_only_after_release(tmp_path: Path) -> None:
    """With ``hold_autotuning`` (the step's baseline autotunes) a worker is passed
    ``--hold-autotuning`` and a stdin pipe: a worker that said its cheap variant and waits on its
    stdin has said nothing of its autotuning one until ``release()`` writes it a line; then it
    does. ``release()`` twice, and after ``stop()``, does nothing; ``stop()`` leaves no pipe open.
    Without ``hold_autotuning`` the flag is not passed and stdin is no pipe (the same worker
    reads its end at once)."""
    from kforge.optimize import warm

    log = tmp_path / "worker-args"
    fake = tmp_path / "fake-python"
    fake.write_text(HELD_WORKER.replace("LOG", str(log)))
    fake.chmod(0o755)
    spec = warm.WarmSpec(VECTOR_ADD, "default", "cpu", 1)
    variants = ["default", "max-autotune+freezing"]
    held = warm.CompileWorkers(spec, variants, python=str(fake), hold_autotuning=True)
    try:
        assert held.wait("default") == {"variant": "default", "ok": True, "seconds": 0.5}
        lines = log.read_text().splitlines()  # written before its first line
        assert "--hold-autotuning" in lines and "stdin: a pipe" in lines, lines
        assert lines[lines.index("--warm-only") + 1] == "default,max-autotune+freezing", lines
        proc = held._workers[0].proc
        assert not held.compiled("max-autotune+freezing"), "held: it waits on its stdin"
        assert proc.poll() is None, "held: still waiting, not exited"
        held.release()
        assert proc.stdin is not None and proc.stdin.closed
        assert held.wait("max-autotune+freezing", deadline=time.time() + 60.0) == {
            "variant": "max-autotune+freezing", "ok": True, "seconds": 2.0}, "released: it went on"
        held.release()  # twice: nothing more
    finally:
        held.stop()
    held.release()  # after stop: nothing, no broken pipe
    assert proc.returncode is not None
    stopped = warm.CompileWorkers(spec, variants, python=str(fake), hold_autotuning=True)
    stopped.stop()  # while it waits on its stdin: terminated, its pipe closed without a write
    assert all(w.proc.stdin is not None and w.proc.stdin.closed for w in stopped._workers)
    stopped.release()
    free = warm.CompileWorkers(spec, variants, python=str(fake))
    with free:
        assert free.wait("default") == {"variant": "default", "ok": True, "seconds": 0.5}
        lines = log.read_text().splitlines()
        assert "--hold-autotuning" not in lines and "stdin: not a pipe" in lines, lines
        assert free._workers[0].proc.stdin is None
        assert free.wait("max-autotune+freezing", deadline=time.time() + 60.0) is not None, "not held"
        free.release()  # nothing to release


def test_a_held_worker_compiles_what_does_not_autotune_first_then_waits_for_the_step(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``--hold-autotuning``: the worker prepares its variants without autotuning at once, in the
    step's order, then reads a line of its stdin (its end too lets it go on) before those that
    autotune, saying so; one line on stdout per variant as before. Not held, or with nothing that
    autotunes, it reads nothing."""
    events: List[str] = []

    def prepare_one(variant: str, model: Any, ref: Any, dev: Any, ready: Dict[str, Any],
                    report: Dict[str, Dict[str, Any]]) -> None:
        events.append(variant)
        report[variant] = {"ok": True}

    class Stdin:
        def readline(self) -> str:
            events.append("(held)")
            return ""  # its end: a step that ended

    monkeypatch.setattr(dispatch, "prepare_one", prepare_one)
    monkeypatch.setattr(dispatch, "reference", lambda problem, dev: SimpleNamespace(model=None))
    monkeypatch.setattr(sys, "stdin", Stdin())
    share = ["max-autotune+freezing", "default", "default+coordinate-descent", "reduce-overhead",
             "max-autotune-no-cudagraphs", "default+freezing"]
    cheap = ["default", "reduce-overhead", "default+freezing"]
    autotuning = ["max-autotune+freezing", "default+coordinate-descent", "max-autotune-no-cudagraphs"]
    assert dispatch.held_order(share) == (cheap, autotuning)
    assert dispatch.held_order(cheap) == (cheap, []) and dispatch.held_order([]) == ([], [])
    capsys.readouterr()
    dispatch.warm_only(None, share, torch.device("cpu"), hold=True)
    assert events == [*cheap, "(held)", *autotuning]
    out, err = capsys.readouterr()
    assert [json.loads(line)["variant"] for line in out.splitlines()] == [*cheap, *autotuning]
    assert f"holds {', '.join(autotuning)} (autotuning) until the step prepared its baseline" in err, err
    for variants, hold in ((share, False), (cheap, True)):
        events.clear()
        dispatch.warm_only(None, variants, torch.device("cpu"), hold=hold)
        assert events == variants, "nothing held"
    assert "holds" not in capsys.readouterr().err


def test_the_step_releases_held_workers_once_its_baseline_is_prepared_or_given_up(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``prepare_modes`` releases the workers right after its baseline, before it waits for any
    of their variants; a baseline interrupted at the step's end releases them too."""

    class Held:
        count = 1

        def __init__(self) -> None:
            self.events: List[str] = []

        def compiled(self, variant: str) -> bool:
            return False

        def wait(self, variant: str, deadline: Any = None) -> Any:
            self.events.append(f"wait {variant}")
            return None

        def release(self) -> None:
            self.events.append("release")

    real = dispatch.build
    workers = Held()
    slow: List[str] = []

    def build(model: Any, mode: str) -> Any:
        workers.events.append(f"build {mode}")
        if mode in slow:
            compile_outliving_the_step("the step's end never interrupted the baseline")
        return real(model, "eager")

    monkeypatch.setattr(dispatch, "build", build)
    ref = dispatch.reference(dispatch.load_problem(VECTOR_ADD, "default"), torch.device("cpu"))
    modes = ["max-autotune-no-cudagraphs", "default", "max-autotune+freezing"]
    ready, _ = dispatch.prepare_modes(ref, modes, torch.device("cpu"), workers=workers)  # type: ignore[arg-type]
    assert sorted(ready) == sorted(modes)
    assert workers.events == ["wait max-autotune-no-cudagraphs", "build max-autotune-no-cudagraphs", "release",
                              "wait default", "build default", "wait max-autotune+freezing",
                              "build max-autotune+freezing"]
    workers.events.clear()
    slow.append(modes[0])
    ready, report = dispatch.prepare_modes(ref, modes, torch.device("cpu"), until=time.time() + 0.5,
                                           workers=workers, end=time.time() + 1.0)  # type: ignore[arg-type]
    assert ready == {} and report[modes[0]]["why"].startswith(dispatch.BASELINE_PAST_END)
    assert workers.events == ["wait max-autotune-no-cudagraphs", "build max-autotune-no-cudagraphs", "release"]


def test_compile_workers_are_held_only_beside_a_baseline_that_autotunes_and_the_record_says_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The measure step holds its workers' autotuning variants (``hold_autotuning``) when its
    baseline's compile autotunes, releases them once, and records ``held_autotuning`` beside
    ``asked`` and ``started``; with a baseline that does not autotune the record is as before."""
    made: List[Dict[str, Any]] = []

    class Workers:
        def __init__(self, spec: Any, variants: Any, python: Any = None, hold_autotuning: bool = False) -> None:
            self.count = spec.workers
            made.append({"variants": list(variants), "hold": hold_autotuning, "released": 0})

        def compiled(self, variant: str) -> bool:
            return False

        def wait(self, variant: str, deadline: Any = None) -> Any:
            return None

        def release(self) -> None:
            made[-1]["released"] += 1

        def __enter__(self) -> "Workers":
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    real = dispatch.build
    monkeypatch.setattr(dispatch, "build", lambda model, mode: real(model, "eager"))
    monkeypatch.setattr(dispatch, "CompileWorkers", Workers)
    monkeypatch.setenv("KFORGE_SOCKET", "/nonexistent/kforge.sock")
    warnings.simplefilter("ignore")  # no daemon: regions are not exclusive (pytest restores the filters)
    problem = dispatch.load_problem(VECTOR_ADD, "default")
    from kforge.optimize.warm import WarmSpec

    spec = WarmSpec(VECTOR_ADD, "default", "cpu", 2)
    r = dispatch.measure(problem, ["max-autotune-no-cudagraphs", "default", "max-autotune+freezing"],
                         torch.device("cpu"), 2, warm=spec)
    assert r["compile_workers"] == {"asked": 2, "started": 2, "held_autotuning": True}, r["compile_workers"]
    assert made == [{"variants": ["default", "max-autotune+freezing"], "hold": True, "released": 1}]
    json.dumps(r["compile_workers"])
    made.clear()
    r = dispatch.measure(problem, ["default", "max-autotune-no-cudagraphs", "default+freezing"],
                         torch.device("cpu"), 2, warm=spec)
    assert r["compile_workers"] == {"asked": 2, "started": 2}, r["compile_workers"]
    assert [m["hold"] for m in made] == [False]


LEAVING_STEP = """\
import atexit, concurrent.futures, sys, threading
from kforge.optimize import dispatch
atexit.register(lambda: print('atexit ran', flush=True))
held = threading.Event()
if sys.argv[1] == 'thread':
    threading.Thread(target=held.wait, name='compile-pool-0').start()
elif sys.argv[1] in ('idle-pool', 'busy-pool'):
    pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix='autotune')
    pool.submit(lambda: None).result()
    if sys.argv[1] == 'busy-pool':
        pool.submit(held.wait)
def main():
    print('result written')
    if sys.argv[2] == 'raise':
        raise RuntimeError('the benchmark exploded')
    return 3
dispatch.LEAVE_GRACE_S = 0.5
dispatch.run_then_leave(main, 'config')
"""


def run_leaving_step(tmp_path: Path, threads: str, ending: str = "return") -> "subprocess.CompletedProcess[str]":
    script = tmp_path / "step.py"
    script.write_text(LEAVING_STEP)
    env = {**os.environ, "PYTHONPATH": str(REPO / "python")}
    return subprocess.run([sys.executable, str(script), threads, ending], capture_output=True, text=True, env=env,
                          timeout=120)


def test_a_step_leaves_without_the_threads_that_would_hold_its_exit(tmp_path: Path) -> None:
    """A thread still running at exit (an interrupted compile's pool) would be joined by the
    interpreter's shutdown: after its grace the step names it and exits without waiting, with its
    exit status and its output flushed. Idle pool workers end when told to: that step exits as
    usual (atexit handlers run), as one without threads does."""
    for threads, name in (("thread", "compile-pool-0"), ("busy-pool", "autotune_")):
        held = run_leaving_step(tmp_path, threads)
        assert held.returncode == 3 and held.stdout == "result written\n", (threads, held.stdout, held.stderr)
        assert f"config: leaving 1 thread(s) still running 0.5 s after the step ended, not waited for: {name}" \
            in held.stderr, held.stderr
    for threads in ("none", "idle-pool"):
        free = run_leaving_step(tmp_path, threads)
        assert free.returncode == 3 and free.stdout == "result written\natexit ran\n", (threads, free.stdout, free.stderr)
        assert "leaving" not in free.stderr


def test_a_step_that_raises_still_leaves_without_its_threads(tmp_path: Path) -> None:
    """An exception out of ``main`` is printed as the interpreter would and exits 1, without
    joining a thread still running."""
    r = run_leaving_step(tmp_path, "thread", "raise")
    assert r.returncode == 1 and r.stdout == "result written\n", (r.stdout, r.stderr)
    assert "RuntimeError: the benchmark exploded" in r.stderr and "config: leaving 1 thread(s)" in r.stderr
    r = run_leaving_step(tmp_path, "none", "raise")
    assert r.returncode == 1 and "RuntimeError: the benchmark exploded" in r.stderr and r.stdout.endswith("atexit ran\n")


def test_only_modes_with_cuda_graphs_count_as_measuring_them() -> None:
    assert dispatch.measures_cuda_graphs(["default", "max-autotune+freezing"])
    assert dispatch.measures_cuda_graphs(["eager", "reduce-overhead~rewrite"])
    assert not dispatch.measures_cuda_graphs(["eager", "default+coordinate-descent", "max-autotune-no-cudagraphs"])


def test_the_inputs_a_cuda_graph_copies_are_counted_on_a_gpu_only() -> None:
    """``input_bytes``: the tensor inputs' bytes (what max-autotune's CUDA graphs copy every
    call); recorded only on a GPU, where Inductor replays graphs."""
    xs = [torch.zeros(4, 8, dtype=torch.bfloat16), 3, torch.zeros(5, dtype=torch.float32), None]
    assert dispatch.input_bytes(xs) == 4 * 8 * 2 + 5 * 4
    problem = dispatch.load_problem(VECTOR_ADD, "default")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = dispatch.measure(problem, ["eager", "default", "max-autotune"], torch.device("cpu"), 2)
    assert "input_bytes" not in r


def test_an_early_rewrite_out_of_memory_beside_the_compile_workers_is_prepared_again_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The early rewrite runs while compile workers compile the autotuning variants: a variant of
    it that ran out of GPU memory beside them makes the step stop them and prepare it again."""

    class Workers:
        count, stopped = 1, False

        def stop(self) -> None:
            self.stopped = True

    tries: List[int] = []

    def prepare_rewrite(problem: Any, ref: Any, baseline: str, classes: Any, dev: Any, ready: Dict[str, Any],
                        report: Dict[str, Any], modes: Any = None) -> Dict[str, Any]:
        tries.append(len(tries))
        report["eager~rewrite"] = {"ok": True} if len(tries) > 1 else {"ok": False, "why": "OutOfMemoryError: CUDA out of memory"}
        return {"fired": True}

    monkeypatch.setattr(dispatch, "prepare_rewrite", prepare_rewrite)
    step = dispatch.RewriteStep(None, None, "default", ["exact"], torch.device("cpu"), lambda ahead: False)
    workers = Workers()
    step.workers = workers
    report: Dict[str, Dict[str, Any]] = {"default": {"ok": True, "first_call_s": 1.0}}
    assert step.run({"default": lambda: None}, report) == {"fired": True}
    assert workers.stopped and len(tries) == 2
    assert report["eager~rewrite"] == {"ok": True, "retried_alone": True}
    step.workers = None  # alone already: an out-of-memory failure is the rewrite's own
    tries.clear()
    report = {"default": {"ok": True, "first_call_s": 1.0}}
    step.run({"default": lambda: None}, report)
    assert len(tries) == 1 and "OutOfMemoryError" in report["eager~rewrite"]["why"]


def test_resetting_the_graph_trees_drops_dynamos_compiled_code_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The trees alone leave each compiled function calling a shut-down manager: the reset drops
    Dynamo's compiled code as well, after the trees."""
    from torch._inductor import cudagraph_trees

    order: List[str] = []
    monkeypatch.setattr(cudagraph_trees, "reset_cudagraph_trees", lambda: order.append("trees"))
    monkeypatch.setattr(torch._dynamo, "reset", lambda: order.append("dynamo"))
    dispatch.reset_graph_trees()
    assert order == ["trees", "dynamo"]


def test_a_bounded_step_with_room_for_the_eager_rewrite_alone_times_it_and_names_the_other(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The rewrite as a whole would end past the step's deadline, its eager variant would not:
    ``eager~rewrite`` is prepared and timed, ``BASELINE~rewrite`` is listed as not prepared."""
    built = order_of_preparation(monkeypatch)
    monkeypatch.setattr(dispatch, "rewrite_expected_s", lambda report, baseline: 1e6)
    problem = dispatch.load_problem(DIAG_SCALE, "default")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = dispatch.measure(problem, ["default", "eager"], torch.device("cpu"), 2, ["exact"], until=time.time() + 600.0)
    assert built == ["default", "eager", "REWRITE", "eager"], built
    assert "eager~rewrite" in r["modes"] and "default~rewrite" not in r["prepared"], r["prepared"].keys()
    assert r["not_prepared"] == ["default~rewrite"] and r["rewrite"]["fired"], r
