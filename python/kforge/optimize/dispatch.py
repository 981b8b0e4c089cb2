"""The ``dispatch``, ``inductor`` and ``rewrite`` agents of ``kforge optimize``: how a problem's
forward is dispatched — eager, or ``torch.compile`` in one of its modes (dispatch), or in the
baseline's mode with one of Inductor's knobs changed (inductor: ``MODE+KNOB`` variants), or the
forward rewritten by the rewrite rules and run eagerly or in the baseline's mode (rewrite:
``MODE~rewrite`` variants, when a rule fires) — chosen per problem by measurement, never set
globally.

``python3 -m kforge.optimize.dispatch PROBLEM --out RESULT.json [--device cpu|cuda]
[--size default|large] [--modes eager,default,...] [--knobs freezing,...] [--rewrite
exact,reassociates] [--baseline MODE] [--rounds N] [--graph-rounds N]`` (``--rewrite CLASSES``: the rewrite agent with
the exactness classes it may use; empty, the default: off)

Each mode runs on its own copy of the reference model (the same weights; a copy per mode, so
that no compiled code is shared between modes); its first call (the compile) is timed, and its
output is compared with eager's at the dtype's tolerance (a mode that computes otherwise, or
fails to compile, is excluded with its reason). Then the modes that remain are timed against the
baseline in interleaved rounds: per round fresh inputs, and baseline, every mode and baseline
again called in turn inside one kforge region (``kforge.do_bench_interleaved``; at least
``ROUND_MIN_CALLS`` timed calls of each, every timed call after an untimed call of the same
mode). Per mode the speedup is the geometric mean of baseline/mode over rounds with its 95 %
interval; the noise floor is the upper end of the same interval for baseline-again/baseline. The
winner is the fastest mode whose interval's lower end clears the floor; if none does, the
baseline stays (``fallback``). With ``--graph-rounds N`` and a forward that Dynamo splits into
several graphs, the agent then searches a mode per graph (``graphs:M0/M1/...`` plans, coordinate
descent from the winner: :func:`graph_search`). Exit status: 0 result written, 2 could not run (bad input or the
environment: one line ``kforge optimize: WHY``).

torch is imported inside the functions that use it (the entry point reports a missing torch).
"""

from __future__ import annotations

import argparse
import concurrent.futures.thread as pool_threads
import contextlib
import copy
import functools
import hashlib
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, FrozenSet, Iterator, List, NoReturn, Optional, Sequence, Tuple

from ..autoregions import inductor_regions, release_inductor_regions
from ..bench import do_bench_interleaved
from ..harness import SIZES, TAINTED_RETAKES, Fp64Reference, retake_tainted, clone_output, finite_json, judge, make_inputs, mean_half, noise_floor, paired_round
from ..harness import load_problem as harness_load_problem
from ..inspect.inductor import CUDA_GRAPH_MODES, WrapperHook
from ..inspect.traces import device_totals, trace_events
from ..region import region
from .rewrite import EXACTNESS, RuleError, candidate, introduced, rewrite_model, rules_of
from .warm import CompileWorkers, WarmSpec, say, warmable, worker_line, workers_for_memory

#: Every mode the agent knows: eager and torch.compile's modes.
MODES = ("eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: Modes that need a GPU (CUDA graphs; max-autotune's graphs are skipped on the CPU by Inductor).
GPU_ONLY = ("reduce-overhead",)
#: Timed calls of each mode per round at least.
ROUND_MIN_CALLS = 10

#: Inductor's knobs the inductor agent tries, each alone on top of the baseline's mode (a variant
#: ``BASELINE+KNOB``): the config it sets. Measured per problem; a knob that helps one problem
#: can cost another.
KNOBS: Dict[str, Dict[str, Any]] = {
    "freezing": {"freezing": True},  # weights folded in as constants (inference)
    "aggressive-fusion": {"aggressive_fusion": True},  # fuse even without shared reads
    "coordinate-descent": {"coordinate_descent_tuning": True},  # tune each kernel's config further
    "no-layout-optimization": {"layout_optimization": False},  # keep NCHW (no channels-last transposes)
    "max-autotune-pointwise": {"max_autotune_pointwise": True},  # autotune pointwise kernels too
    "no-epilogue-fusion": {"epilogue_fusion": False},  # keep GEMM epilogues apart
}


#: Knobs that act only on some ops, each with the words one of the graph's op names must contain
#: for it to change anything, and why otherwise: Inductor's layout optimization decides only for
#: graphs with convolutions; epilogue fusion fuses only into template kernels (GEMMs,
#: convolutions). The words are generous (a false match only costs a compile).
KNOB_NEEDS: Dict[str, Tuple[Tuple[str, ...], str]] = {
    "no-layout-optimization": (("conv",), "no convolution in the graphs, so no layout to optimize"),
    "no-epilogue-fusion": (("mm", "matmul", "linear", "conv", "bilinear", "einsum", "tensordot", "attention", "dot", "mv",
                            "inner", "matrix_power", "cov", "corrcoef", "cell", "rnn", "lstm", "gru", "transformer"),
                           "no GEMM or convolution in the graphs, so no template to fuse an epilogue into"),
}


#: The rewrite agent's variants: ``MODE~rewrite`` is the problem's forward rewritten by the
#: rewrite rules, dispatched as ``MODE`` (eager, or the baseline's compile mode).
REWRITE = "~rewrite"
#: The exactness classes the rewrite agent uses by default: every class of the closed set, each
#: within verify's default tolerance for the dtype (``exact``: bit for bit; ``reassociates``: a
#: reordered sum). A class that changed precision would not be a default (and would need the
#: verify policy's ``precision``).
REWRITE_CLASSES = EXACTNESS


#: The dispatch agent's per-graph plans, for a forward that Dynamo splits into several graphs (graph
#: breaks): ``graphs:M0/M1/...`` is the forward compiled with one backend that dispatches the i-th
#: graph Dynamo hands it as ``Mi`` (eager, or a compile mode's Inductor options), in the order
#: Dynamo first compiles them (a graph past the plan runs eagerly).
GRAPHS = "graphs:"
#: Coordinate-descent rounds over the graphs at most (``--graph-rounds``; kforge optimize passes
#: this with the dispatch agent): each round measures the plans one graph away from the current
#: one, and moves to the best that beats it beyond noise in the same rounds.
GRAPH_ROUNDS = 2
#: Plans one round measures at most (the largest graphs' first: by their number of ops).
MAX_GRAPH_PLANS = 8


class DispatchError(Exception):
    """Bad input or an environment that cannot run the measurement (exit status 2)."""


def parse_modes(text: str, baseline: str, device: str, knobs: str = "", rewrite: bool = False) -> List[str]:
    """The variants to measure, the baseline first: each a known mode, no repeats, none that
    needs a GPU when the device is the CPU; then ``BASELINE+KNOB`` per known knob (only on a
    compiled baseline). With ``rewrite`` the baseline alone is enough: the rewrite agent's
    variants are added once a rule fires."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    named = [k.strip() for k in knobs.split(",") if k.strip()]
    bad = [part for k in named for part in k.split("+") if part not in KNOBS]
    if bad:
        raise DispatchError(f"unknown knob {bad[0]!r} (one of: {', '.join(KNOBS)}; combined with +)")
    twice = [k for k in named if len(set(k.split("+"))) != len(k.split("+"))]
    if twice:
        raise DispatchError(f"a knob is named twice in the combination {twice[0]!r}")
    if named and baseline == "eager":
        raise DispatchError("knobs are Inductor's: they need a compiled baseline, not eager")
    for plan in [m for m in modes if m.startswith(GRAPHS)]:
        graph_plan(plan)  # a DispatchError naming what is wrong in it
    unknown = [m for m in modes + [baseline] if m not in MODES and not m.startswith(GRAPHS)]
    if unknown:
        raise DispatchError(f"unknown mode {unknown[0]!r} (one of: {', '.join(MODES)})")
    if device == "cpu":
        gpu = [(mode, m) for m in modes + [baseline] for mode in (graph_plan(m) or [m]) if mode in GPU_ONLY]
        if gpu:
            mode, m = gpu[0]
            raise DispatchError(f"mode {mode!r}{f' (in {m})' if m != mode else ''} uses CUDA graphs: it needs a GPU (--device cuda)")
    ordered = [baseline] + [m for m in modes if m != baseline]
    combos = [frozenset(k.split("+")) for k in named]
    if len(set(ordered)) != len(ordered) or len(set(combos)) != len(combos):
        raise DispatchError(f"a mode or knob is named twice in {text!r} / {knobs!r}")
    ordered += [f"{baseline}+{k}" for k in named]
    if len(ordered) < 2 and not rewrite:
        raise DispatchError("nothing to compare: name at least one mode besides the baseline")
    return ordered


def graph_plan(variant: str) -> Optional[List[str]]:
    """A per-graph plan's modes, graph by graph (``graphs:M0/M1/...``); ``None`` for any other
    variant. A ``DispatchError`` for a plan without modes or with one that is not a mode."""
    if not variant.startswith(GRAPHS):
        return None
    plan = variant[len(GRAPHS):].split("/")
    bad = [m for m in plan if m not in MODES]
    if bad:
        raise DispatchError(f"per-graph plan {variant!r}: {bad[0]!r} is not a mode (one of: {', '.join(MODES)})")
    return plan


def plan_name(plan: Sequence[str]) -> str:
    """The variant of a per-graph plan; a plan of one mode throughout is that mode itself."""
    return plan[0] if len(set(plan)) == 1 else GRAPHS + "/".join(plan)


#: The per-graph backend's source. It is measured from this text and written into a per-graph
#: winner's result file as is, so what ships is what was timed: ``routed_backend(plan)`` is a
#: ``torch.compile`` backend that dispatches the i-th graph Dynamo hands it as ``plan[i]``, by its
#: own ``forward`` (eager) or by Inductor with the mode's options (what ``torch.compile(mode=)``
#: compiles each graph with); graphs past the plan run eagerly.
ROUTED_BACKEND = """
def routed_backend(plan):
    import torch._inductor
    from torch._inductor.compile_fx import compile_fx

    seen = [0]

    def backend(gm, example_inputs):
        i = seen[0]
        seen[0] += 1
        mode = plan[i] if i < len(plan) else "eager"
        if mode == "eager":
            return gm.forward
        return compile_fx(gm, example_inputs, config_patches=dict(torch._inductor.list_mode_options(mode)))

    return backend
"""


def routed_backend(plan: Sequence[str]) -> Callable[..., Any]:
    """:data:`ROUTED_BACKEND`'s backend for ``plan``."""
    namespace: Dict[str, Any] = {}
    exec(compile(ROUTED_BACKEND, "<kforge routed_backend>", "exec"), namespace)
    return namespace["routed_backend"](list(plan))  # type: ignore[no-any-return]


def load_problem(path: str, size: str) -> Any:
    """The problem at size preset ``size`` (``harness.load_problem``); bad input is a ``DispatchError``."""
    try:
        return harness_load_problem(path, size, "dispatch")
    except ValueError as e:
        raise DispatchError(str(e)) from e


def variant_knobs(variant: str) -> Tuple[str, List[str]]:
    """A variant's mode and its knobs: ``MODE+KNOB[+KNOB...]`` (a combination, the beam's second
    round), ``MODE`` alone without."""
    mode, *knobs = variant.split("+")
    return mode, knobs


def variant_options(variant: str) -> Tuple[str, Optional[Dict[str, Any]]]:
    """A variant's mode and, for ``MODE+KNOB[+KNOB...]``, the Inductor options to compile with:
    the mode's own (``torch._inductor.list_mode_options``) with each knob's setting over them."""
    mode, knobs = variant_knobs(variant)
    if not knobs:
        return mode, None
    import torch._inductor

    options: Dict[str, Any] = dict(torch._inductor.list_mode_options(mode))
    for k in knobs:
        options.update(KNOBS[k])
    return mode, options


def compile_key(variant: str) -> Optional[Tuple[Any, ...]]:
    """What a plain mode or a knob variant compiles with: eager, or its Inductor options in full
    (a mode's own, the knobs' over them); ``None`` for a variant not compared so (a rewrite, a
    per-graph plan)."""
    if variant.endswith(REWRITE) or variant.startswith(GRAPHS):
        return None
    mode, options = variant_options(variant)
    if mode == "eager":
        return ("eager",)
    if options is None:
        import torch._inductor

        options = dict(torch._inductor.list_mode_options(mode))
    return tuple(sorted((k, repr(v)) for k, v in options.items()))


def duplicates(variants: Sequence[str]) -> Dict[str, str]:
    """Variants that compile exactly as an earlier one does (the baseline first), each with that
    one: the same candidate, so it is not compiled and timed again. Against max-autotune the
    coordinate-descent knob is one (max-autotune sets ``coordinate_descent_tuning`` already): in
    the H200 pilot it measured 0.96-1.01x on every level-1 problem, a second baseline."""
    seen: Dict[Tuple[Any, ...], str] = {}
    same: Dict[str, str] = {}
    for v in variants:
        key = compile_key(v)
        if key is None:
            continue
        if key in seen:
            same[v] = seen[key]
        else:
            seen[key] = v
    return same


def build(model: Any, variant: str) -> Callable[..., Any]:
    """``model`` dispatched as ``variant``: itself (eager), compiled in a mode, or compiled with a
    mode's options and one knob changed; static shapes."""
    import torch

    plan = graph_plan(variant)
    if plan is not None:
        return torch.compile(model, backend=routed_backend(plan), dynamic=False)  # type: ignore[no-any-return]
    mode, options = variant_options(variant)
    if mode == "eager":
        return model  # type: ignore[no-any-return]
    if options is not None:
        return torch.compile(model, options=options, dynamic=False)  # type: ignore[no-any-return]
    return torch.compile(model, mode=mode, dynamic=False)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Reference:
    """The reference model built on the device under seed 0, the inputs every variant is first
    called with, its eager output on them (what each variant is compared with), and its fp64
    copy (made only when a variant is beyond the dtype's tolerance of eager)."""

    model: Any
    xs: List[Any]
    expected: Any
    fp64: Fp64Reference


def measures_cuda_graphs(modes: Sequence[str]) -> bool:
    """Whether a variant of ``modes`` (``MODE[+KNOB...][~rewrite]``) replays CUDA graphs (on a
    GPU): its mode is one of :data:`CUDA_GRAPH_MODES`."""
    return any(variant_knobs(v.split("~")[0])[0] in CUDA_GRAPH_MODES for v in modes)


def input_bytes(xs: Sequence[Any]) -> int:
    """The bytes of the forward's tensor inputs: what a mode with CUDA graphs copies into its
    graphs' static input buffers before every replay (inputs that come from eager code are
    copied; parameters and buffers are not). At the large preset that copy alone made
    max-autotune 2.3-3.7x slower than max-autotune-no-cudagraphs on bandwidth-bound problems."""
    import torch

    return sum(int(x.numel()) * int(x.element_size()) for x in xs if isinstance(x, torch.Tensor))


def reference(problem: Any, dev: Any) -> Reference:
    import torch

    torch.manual_seed(0)
    with torch.device(dev):
        ref = problem.Model(*problem.get_init_inputs()).eval()
    xs = make_inputs(problem, 0, "normal", dev)
    with torch.no_grad():
        expected = clone_output(ref(*xs))
    return Reference(ref, xs, expected, Fp64Reference(ref))


#: Work :func:`prepare_modes` runs between its variants, on what it prepared so far.
PrepareHook = Callable[[Dict[str, Callable[..., Any]], Dict[str, Dict[str, Any]]], None]


def prepare_modes(ref: Reference, modes: Sequence[str], dev: Any, until: Optional[float] = None,
                  workers: Optional[CompileWorkers] = None, end: Optional[float] = None,
                  before_autotuning: Optional[PrepareHook] = None
                  ) -> Tuple[Dict[str, Callable[..., Any]], Dict[str, Dict[str, Any]]]:
    """Per mode its callable on its own copy of the reference, its compile time and how its
    output compares with eager's; modes that fail or compute otherwise are left out of the first
    dict and say why in the second. With ``until`` (Unix seconds: the step's deadline) a variant
    but the first (the baseline, always prepared) starts only if it is expected to end before
    ``until`` (:func:`expected_s`); each one left is ``not_prepared`` in the second. A knob variant whose compile generated exactly the code an
    variant of its mode with a subset of its knobs did (:func:`same_code`) is left out of the first dict too,
    ``same_code_as`` that one in the second: it is that candidate again, and timing it would only
    add a chance to win by noise. With ``workers``, a variant one of them has is prepared after
    that worker said it compiled it (its compile then a cache hit: ``warmed`` in the second
    dict); one that ran out of GPU memory beside them is prepared again after they are
    stopped (``retried_alone``). Once the baseline is prepared (or given up), held workers are
    released (:meth:`CompileWorkers.release`): their autotuning variants, compiled after the
    baseline's, find its autotune results in Inductor's caches instead of benchmarking the same
    choices beside it. ``before_autotuning`` runs once, under the same deadline, just
    before the first variant but the baseline whose compile autotunes (:func:`compile_class`), or
    after the last variant when none does: a bounded step's other work that fits before them."""
    ready: Dict[str, Callable[..., Any]] = {}
    report: Dict[str, Dict[str, Any]] = {}
    codes: Dict[str, Tuple[str, ...]] = {}
    longest: Dict[bool, Optional[float]] = {False: 0.0, True: None}  # the longest so far, by whether a cache hit
    started = time.perf_counter()
    if modes:  # the baseline: always prepared, interrupted only at the step's end
        try:
            with deadline_alarm(end):
                prepare_next(1, modes, ref, dev, ready, report, codes, longest, workers, until)
        except StepDeadline:
            if modes[0] not in ready:  # (not when the alarm came just after it was ready)
                report[modes[0]] = {"ok": False, "why": f"{BASELINE_PAST_END} (after {time.perf_counter() - started:.0f} s)"}
                say(f"interrupted the baseline {modes[0]}: {BASELINE_PAST_END}")
                for other in modes[1:]:
                    report[other] = {"ok": False, "not_prepared": NOT_PREPARED}
                return {}, report
        finally:  # held workers go on to their autotuning variants: the baseline's autotuning is done
            if workers is not None:
                workers.release()
    current: List[int] = []  # the index of the variant being prepared (none: all done, or in the hook)
    hook = [before_autotuning] if before_autotuning is not None else []
    try:  # outside the alarm's block: the alarm may come anywhere in it, its end included
        with deadline_alarm(until):
            for i in range(2, len(modes) + 1):
                if hook and autotunes(modes[i - 1]):
                    current.clear()
                    hook.pop()(ready, report)
                current[:] = [i]
                prepare_next(i, modes, ref, dev, ready, report, codes, longest, workers, until)
            current.clear()
            if hook:
                hook.pop()(ready, report)
    except StepDeadline:
        if current:
            mark_interrupted(modes[current[0] - 1], modes[current[0]:], ready, report, time.perf_counter() - started)
        for mode in modes:  # those after an interrupted hook
            report.setdefault(mode, {"ok": False, "not_prepared": NOT_PREPARED})
    for variant, other in same_code(modes, codes, ready).items():
        del ready[variant]  # not timed (Dynamo's cache may still hold its compiled copy)
        report[variant]["same_code_as"] = other
    return ready, report


#: Knobs whose compile benchmarks Triton configurations (autotuning): as long as a max-autotune
#: mode's compile, not a plain one's.
AUTOTUNING_KNOBS = frozenset({"max-autotune-pointwise", "coordinate-descent"})


def compile_class(variant: str) -> int:
    """How long ``variant``'s preparation is expected to be, in classes a bounded step prepares
    in order: 0 eager (no compile), 1 a compile without autotuning (the cost of the baseline's
    default compile), 2 one that autotunes (a max-autotune mode or an autotuning knob), 3 a
    max-autotune mode that autotunes more besides (an autotuning knob on top: every pointwise
    kernel's configurations, or coordinate descent). A large decoder layer's default compile
    took 8 s on an H100 and its max-autotune compile outlived the 220 s left of the step;
    prepared third, it cut every knob variant after it. In session 32 the same layer's
    max-autotune compile took 104.5 s and max-autotune+max-autotune-pointwise ran 482 s until
    the step's deadline, prepared before max-autotune+no-epilogue-fusion, which it cut."""
    mode, knobs = variant_knobs(variant.split("~")[0])
    if mode == "eager":
        return 0
    if mode.startswith("max-autotune"):
        return 3 if AUTOTUNING_KNOBS & set(knobs) else 2
    return 2 if AUTOTUNING_KNOBS & set(knobs) else 1


def autotunes(variant: str) -> bool:
    """Whether ``variant``'s compile autotunes (:func:`compile_class` 2 or more)."""
    return compile_class(variant) >= 2


def prepare_next(i: int, modes: Sequence[str], ref: Reference, dev: Any, ready: Dict[str, Callable[..., Any]],
                 report: Dict[str, Dict[str, Any]], codes: Dict[str, Tuple[str, ...]],
                 longest: Dict[bool, Optional[float]], workers: Optional[CompileWorkers], until: Optional[float]) -> None:
    """:func:`prepare_modes`' step for ``modes[i - 1]``: left out (``not_prepared``) when it
    is not the baseline and is expected to end past ``until``; else prepared, its generated code
    and its time recorded (``longest``, by whether its compile was a cache hit)."""
    mode = modes[i - 1]
    if until is not None and i > 1 and time.time() + expected_s(mode, longest, workers) > until:
        report[mode] = {"ok": False, "not_prepared": NOT_PREPARED}
        say(f"not prepared {mode} ({i} of {len(modes)}): {NOT_PREPARED}")
        return
    t0 = time.perf_counter()
    codes[mode] = prepare_warmed(mode, ref, dev, ready, report, workers, until)
    if codes[mode]:  # what Inductor generated, autotune choices included (compare runs by it)
        report[mode]["code"] = hashlib.sha256("".join(codes[mode]).encode()).hexdigest()[:16]
    took = time.perf_counter() - t0
    said = report[mode].get("warmed") or {}
    hit = bool(said.get("ok") and said.get("cache_hit"))
    longest[hit] = max(longest[hit] or 0.0, took)
    state = "ready" if mode in ready else f"left out: {report[mode].get('why', 'its output differs from eager')}"
    say(f"prepared {mode} ({i} of {len(modes)}) in {took:.1f} s: {state}")


#: Seconds a step's exit gives the threads still running to end (idle pool workers end at once
#: when told to) before it leaves without them.
LEAVE_GRACE_S = 10.0


def running_threads() -> List[threading.Thread]:
    """The threads besides this main one that the interpreter's shutdown would join."""
    return [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive() and not t.daemon]


def leave(rc: int, who: str = "dispatch", grace_s: Optional[float] = None) -> NoReturn:
    """The step's process exits with ``rc``. The interpreter's shutdown joins every thread still
    running, and an interrupted compile's pool goes on compiling and benchmarking Inductor's
    choices after the step's deadline (on an H100 a step was still in max-autotune's benchmarks
    when its run, 60 s past its budget, was killed). So the thread pools are told to stop (what
    shutdown does first: idle workers end at once) and the threads get ``grace_s`` to end
    (:data:`LEAVE_GRACE_S` without it); those
    still running then are named (a line on stderr) and not waited for: kforge's own exit work is
    done (:func:`kforge.autoregions.release_inductor_regions`), the standard streams are flushed
    and the process ends at once (``os._exit``; the daemon ends its regions with its connections).
    The output is written before: ``main`` returned."""
    grace = LEAVE_GRACE_S if grace_s is None else grace_s
    others = running_threads()
    if others:
        started = time.monotonic()
        stop_pools = getattr(pool_threads, "_python_exit", None)  # what shutdown runs first (3.9+)
        if callable(stop_pools):
            stopper = threading.Thread(target=stop_pools, name="kforge-leave", daemon=True)
            stopper.start()
            stopper.join(grace)
        for t in others:
            t.join(max(0.0, grace - (time.monotonic() - started)))
        others = running_threads()
    if not others:
        sys.exit(rc)
    names = ", ".join(sorted(t.name for t in others)[:8]) + (", …" if len(others) > 8 else "")
    print(f"{who}: leaving {len(others)} thread(s) still running {grace:g} s after the step ended, "
          f"not waited for: {names}", file=sys.stderr)
    release_inductor_regions()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(rc)


def run_then_leave(main: Callable[[], int], who: str) -> NoReturn:
    """A step's ``__main__``: ``main()``, then :func:`leave` with its exit status, also when it
    raised (the traceback printed as the interpreter would: 1, 130 for an interrupt; a
    ``SystemExit`` keeps its status, argparse's 2 included)."""
    try:
        rc = main()
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        traceback.print_exc()
        rc = 130
    except BaseException:  # printed as the interpreter would, then the same exit
        traceback.print_exc()
        rc = 1
    leave(rc, who)


class StepDeadline(BaseException):
    """Raised in the main thread by :func:`deadline_alarm` when a deadline comes while a
    variant is still being prepared (``--prepare-until``; the baseline's, ``--until``). Callers
    catch it outside the alarm's block (it may come anywhere in it). A ``BaseException``,
    so that a variant's own ``except Exception`` (a compile that fails is a variant left out)
    does not take it for the variant's failure."""


@contextlib.contextmanager
def deadline_alarm(until: Optional[float]) -> Iterator[None]:
    """``SIGALRM`` at ``until`` (Unix seconds) raising :class:`StepDeadline` inside the
    ``with`` block, disarmed when it ends: a compile that started expected to end in time (the
    estimate is the longest compile so far; one max-autotune compile under load took longer than
    the whole rest of a step) is interrupted at the deadline instead of outliving the step, which
    the run would then kill with all its work lost. Nothing without ``until``, off the main
    thread (signals are delivered there only) or where ``setitimer`` does not exist."""
    if until is None or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return
    left = until - time.time()
    if left <= 0:  # already past: nothing is started then (each variant's gate says so), no alarm races it
        yield
        return
    armed = [True]

    def fire(signum: int, frame: Any) -> None:
        if armed[0]:  # not once the block has ended
            raise StepDeadline()

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, left)
    try:
        yield
    finally:
        # The timer off first; an alarm delivered meanwhile raises out of the block, where the
        # caller's ``except StepDeadline`` (outside it) takes it; the handler is restored whatever.
        try:
            signal.setitimer(signal.ITIMER_REAL, 0)
            armed[0] = False
        finally:
            signal.signal(signal.SIGALRM, previous)


#: Why the baseline was not prepared: its compile outlived the whole step (``--until``).
BASELINE_PAST_END = ("its compile was still running at the step's end (--until) and was interrupted: no run of "
                     "this wall budget holds it (a larger --budget-wall-s, fewer --jobs, or a warm Inductor cache)")
#: Why a variant was not prepared: the step's deadline came during its compile.
INTERRUPTED = "the step's deadline came during its compile, which was interrupted"


def mark_interrupted(mode: str, rest: Sequence[str], ready: Dict[str, Callable[..., Any]],
              report: Dict[str, Dict[str, Any]], after_s: float) -> None:
    """The deadline came while ``mode`` was prepared: it is ``not_prepared`` (unless it had
    become ready just before), and so is every variant after it (``rest``)."""
    if mode not in ready:
        report[mode] = {"ok": False, "not_prepared": INTERRUPTED}
        say(f"interrupted {mode} after {after_s:.1f} s of the preparation: {INTERRUPTED}")
    for other in rest:
        report.setdefault(other, {"ok": False, "not_prepared": NOT_PREPARED})


#: What a cache hit is expected to take of a cold compile before one was timed: Dynamo traces
#: the forward again and the compiled graph is loaded, which for a big graph is not nothing.
WARM_SHARE = 0.25


def expected_s(mode: str, longest: Dict[bool, Optional[float]], workers: Optional[CompileWorkers]) -> float:
    """What preparing ``mode`` is expected to take, for a bounded step's deadline: nothing for
    eager (no compile: one forward); for a variant a compile worker already compiled (a cache
    hit) the longest cache hit so far (``longest[True]``), or :data:`WARM_SHARE` of the longest
    cold preparation before one was timed; else the longest cold one (``longest[False]``: the
    baseline's compile first). A GRU's baseline compiled for 252 s on an H100; taking that for
    every variant left eager and the warmed ones unprepared."""
    cold = longest[False] or 0.0
    if mode.split("~")[0] == "eager":
        return 0.0
    if workers is not None and workers.compiled(mode):
        warm = longest[True]
        return WARM_SHARE * cold if warm is None else warm
    return cold


def prepare_warmed(mode: str, ref: Reference, dev: Any, ready: Dict[str, Callable[..., Any]],
                   report: Dict[str, Dict[str, Any]], workers: Optional[CompileWorkers],
                   until: Optional[float] = None) -> Tuple[str, ...]:
    """:func:`prepare_one` under :func:`generated_code`, after the compile worker that has
    ``mode`` (if one does) said it compiled it (waiting no later than ``until``, the step's
    deadline); what the worker said and whether the compile hit Inductor's FX graph cache go into
    ``report[mode]["warmed"]``. A variant that ran out of GPU memory while workers ran (the error
    itself or wrapped in a compile error) is prepared again once they are stopped."""
    said = workers.wait(mode, until) if workers is not None else None
    hits = fx_cache_hits()
    codes = generated_code(lambda: prepare_one(mode, ref.model, ref, dev, ready, report))
    warmed = {**said, "cache_hit": fx_cache_hits() > hits} if said is not None else None
    if workers is not None and workers.count and out_of_memory(str(report[mode].get("why", ""))):
        import torch

        say(f"{mode} ran out of GPU memory beside the compile workers: they are stopped, it is prepared again")
        workers.stop()
        torch.cuda.empty_cache()
        codes = generated_code(lambda: prepare_one(mode, ref.model, ref, dev, ready, report))
        report[mode]["retried_alone"] = True
    if warmed is not None:
        report[mode]["warmed"] = warmed
    return codes


def out_of_memory(why: str) -> bool:
    """Whether a variant's failure is the device's memory: torch's ``OutOfMemoryError``, also
    when a compile error wraps it (``BackendCompilerFailed: ... CUDA out of memory``)."""
    return why.startswith("OutOfMemoryError") or "out of memory" in why.lower()


def fx_cache_hits() -> int:
    """The compiles this process loaded from the caches so far: Inductor's FX graph cache hits
    and AOTAutograd's cache hits (which load the compiled graph without asking the FX graph
    cache); 0 where torch does not count them."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters["inductor"].get("fxgraph_cache_hit", 0)) + int(counters["aot_autograd"].get("autograd_cache_hit", 0))


def warm_only(problem: Any, variants: Sequence[str], dev: Any, hold: bool = False) -> None:
    """A compile worker (``--warm-only``, :mod:`.warm`): each of ``variants`` prepared as the
    measure step prepares it (so that its compile fills the caches the step will read), one
    line on stdout as each is done. With ``hold`` (``--hold-autotuning``: the step's baseline
    autotunes) those whose compile does not autotune first, then, after a line on stdin (the
    step's :meth:`CompileWorkers.release` once its baseline is prepared) or its end (a step that
    ended never leaves a worker waiting), those that do (:func:`held_order`): autotuned beside
    the baseline's compile, they would run its benchmarks again, each in an exclusive region
    under a daemon, and delay the compile the step needs first; after it, they find most of their
    autotuning in Inductor's autotune cache."""
    now, later = held_order(variants) if hold else (list(variants), [])
    ref = reference(problem, dev)
    with room_to_compile(len(variants) + 1):
        for v in now:
            warm_one(v, ref, dev)
        if later:
            say(f"compile worker {os.getpid()} holds {', '.join(later)} (autotuning) until the step prepared its baseline")
            sys.stdin.readline()
            say(f"compile worker {os.getpid()} released: compiling {', '.join(later)}")
        for v in later:
            warm_one(v, ref, dev)


def held_order(variants: Sequence[str]) -> Tuple[List[str], List[str]]:
    """``variants`` as a held compile worker compiles them: those whose compile does not autotune
    (:func:`compile_class` below 2) at once, and those that do after the step released it; each
    list in the order given (the step's)."""
    return [v for v in variants if not autotunes(v)], [v for v in variants if autotunes(v)]


def warm_one(variant: str, ref: Reference, dev: Any) -> None:
    """A compile worker's preparation of ``variant`` (:func:`warm_only`), its line on stdout."""
    t0 = time.perf_counter()
    ready: Dict[str, Callable[..., Any]] = {}
    report: Dict[str, Dict[str, Any]] = {}
    prepare_one(variant, ref.model, ref, dev, ready, report)
    why = report[variant].get("why")
    print(worker_line(variant, why is None, time.perf_counter() - t0, why), flush=True)


#: Why a variant was not prepared: the measure step's deadline (``--prepare-until``).
NOT_PREPARED = "the step's deadline came first (kforge optimize bounds a step that no wall budget of this size holds)"


#: Comment lines of an Inductor wrapper that say where and when it was made, not what it
#: computes: the compile's number (``# AOT ID``) and each Triton kernel's file in the cache
#: directory (``# kernel path``), which differs between two runs with their own caches.
WRAPPER_PROVENANCE = ("# AOT ID:", "# kernel path:")


def code_digest(wrapper_source: str) -> str:
    """A SHA-256 of an Inductor wrapper's source without its provenance lines
    (:data:`WRAPPER_PROVENANCE`): equal for the same generated code in any run or cache."""
    lines = [line for line in wrapper_source.splitlines() if not line.lstrip().startswith(WRAPPER_PROVENANCE)]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def generated_code(compile_and_call: Callable[[], None]) -> Tuple[str, ...]:
    """:func:`code_digest` of each Inductor wrapper module (the whole generated code: kernels
    are inlined in it) that ``compile_and_call`` loaded, in load order; empty when it loaded none
    (eager, or a frame Dynamo already had)."""
    with WrapperHook() as hook:
        compile_and_call()
    digests = []
    for m in hook.modules:
        try:
            with open(m.__file__, encoding="utf-8") as f:
                digests.append(code_digest(f.read()))
        except (OSError, AttributeError, TypeError):
            return ()  # a module without its source: nothing to compare
    return tuple(digests)


#: Knobs every effect of which is in the code Inductor generates (the graph it lowers, the
#: kernels, each kernel's heuristics and their tuning settings), so that a variant generating the
#: code of one with fewer knobs is that candidate again. A knob acting outside the generated code
#: (CUDA graphs, which wrap it; C++ compiler flags; AOTAutograd's runtime wrappers) must not be
#: listed here: its variants are always timed.
SAME_CODE_KNOBS = frozenset({"freezing", "aggressive-fusion", "coordinate-descent", "no-layout-optimization",
                             "max-autotune-pointwise", "no-epilogue-fusion"})


def same_code(variants: Sequence[str], codes: Dict[str, Tuple[str, ...]], ready: Dict[str, Any]) -> Dict[str, str]:
    """Knob variants (``MODE+KNOB...``, every knob in :data:`SAME_CODE_KNOBS`) whose compile
    generated the same code as a variant of the same mode with a subset of its knobs did (the
    mode itself, or in the beam's round a single knob when the combination's other knobs changed
    nothing), each with the one of fewest knobs, whatever the order they are listed in; both
    prepared, both with code. The same code is the same candidate: the variant with fewer knobs
    stays."""
    same: Dict[str, str] = {}
    by_knobs = sorted(variants, key=lambda v: len(variant_knobs(v)[1]))
    for v in by_knobs:
        mode, knobs = variant_knobs(v)
        if not knobs or "~" in v or not set(knobs) <= SAME_CODE_KNOBS or v not in ready or not codes.get(v):
            continue
        for u in by_knobs:
            u_mode, u_knobs = variant_knobs(u)
            if u == v or len(u_knobs) >= len(knobs):
                break
            if (u_mode == mode and "~" not in u and set(u_knobs) < set(knobs) and u in ready and u not in same
                    and codes.get(u) == codes[v]):
                same[v] = u
                break
    return same


def prepare_one(variant: str, model: Any, ref: Reference, dev: Any,
                ready: Dict[str, Callable[..., Any]], report: Dict[str, Dict[str, Any]]) -> None:
    """``variant``'s mode applied to a copy of ``model``, its first call (on ``ref.xs``) timed and
    judged by :func:`matches`: into ``ready`` when it ran and matched, and into ``report`` either
    way (with ``why`` when not)."""
    import torch

    mode = variant.split("~")[0]
    t0 = time.perf_counter()
    try:
        fn = build(copy.deepcopy(model), mode)
        with torch.no_grad():
            out = clone_output(fn(*ref.xs))
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    except Exception as e:
        report[variant] = {"ok": False, "why": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
        return
    first_call_s = round(time.perf_counter() - t0, 3)
    r = matches(out, ref)
    report[variant] = {"ok": bool(r["ok"]), "first_call_s": first_call_s, **{k: v for k, v in r.items() if k != "ok"}}
    if r["ok"]:
        ready[variant] = fn


def matches(out: Any, ref: Reference) -> Dict[str, Any]:
    """A variant's output judged as verify judges a candidate's (``harness.judge``): within the
    dtype's tolerance of eager, else by the fp64 rule. A compile mode that reorders a sum (a
    cumulative sum, a convolution's algorithm) differs from eager beyond 1e-4 while being as
    accurate; the fp64 rule tells it from a wrong one."""
    return judge(out, ref.expected, {}, ref.fp64, lambda: ref.xs)


def rewrite_without_failing_rules(ref: Reference, rules: List[Any], info: Dict[str, Any]) -> Optional[Any]:
    """``rewrite_model`` with ``rules``; a rule that fails (a bug in it, or a graph it cannot
    rewrite here) is named in ``info["failed_rules"]`` and the rewrite made again without it, so
    one rule's failure does not take the others' rewrites with it. None (``info["why"]`` set)
    when no rule is left or the failure names none of them."""
    while True:
        try:
            return rewrite_model(ref.model, ref.xs, rules)
        except RuleError as e:
            info.setdefault("failed_rules", []).append(str(e))
            left = [r for r in rules if r.name != e.rule]
            if not left or len(left) == len(rules):
                info["why"] = f"a rule failed (a bug in the rule): {e}"
                return None
            rules = left


def prepare_rewrite(problem: Any, ref: Reference, baseline: str, classes: Sequence[str], dev: Any,
                    ready: Dict[str, Callable[..., Any]], report: Dict[str, Dict[str, Any]],
                    modes: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """The rewrite agent: the rules of ``classes`` applied to the reference's FX graph (the
    rewritten module shares the reference's parameters), and when one fired, its variants
    ``eager~rewrite`` and ``BASELINE~rewrite`` (those of ``modes`` when given) prepared as
    :func:`prepare_one` prepares a mode (each on its own copy, compared with the reference's
    eager output). Returns what it proposed:
    ``fired``, the applications with their classes, the weakest class, the forward's key, and what
    the rewrite introduced (:func:`kforge.optimize.rewrite.introduced`) — or why it proposes
    nothing (no rule fired; or the rewrite cannot be shipped or measured: the other agents' variants
    are measured all the same)."""
    info: Dict[str, Any] = {"classes": list(classes), "fired": False}
    result = rewrite_without_failing_rules(ref, list(rules_of(classes)), info)
    if result is None:
        return info
    info["skipped"] = result.skipped
    if not result.changed:
        info["why"] = "no rule fired on the problem's FX graph: the rewrite agent proposes nothing" + (
            f" ({result.skipped})" if result.skipped else "")
        return info
    try:
        with open(problem.__file__) as f:
            found = candidate(result, f.read())
        brought = introduced(result, ref.xs)
    except Exception as e:  # no standalone spelling, or the rewritten forward does not run here
        info["why"] = f"a rule fired but the rewrite cannot be shipped: {type(e).__name__}: {e}"
        return info
    info.update(fired=True, rules=found["changes"], exactness=found["exactness"], key=found["key"], **brought)
    for mode in dict.fromkeys(("eager", baseline) if modes is None else modes):
        variant = mode + REWRITE
        prepare_one(variant, result.module, ref, dev, ready, report)
        report[variant].update(rules=[c["rule"] for c in found["changes"]], exactness=found["exactness"])
    return info


#: Rounds timed first and not counted. On the H200 with 8 problems in flight, the baseline
#: against itself was off by 5-60 % in a measurement's first rounds and within 0.1 % in its
#: last ones (bench/results/optimize-campaign/), so the start of a measurement is not a round.
WARMUP_ROUNDS = 1
#: Timed rounds a step's end never cuts (an interval needs two).
MIN_ROUNDS = 2


def another_round_fits(timed: int, last_s: float, end: Optional[float], now: Optional[float] = None) -> bool:
    """Whether a timing round starts after ``timed`` rounds (warm-up rounds count below zero):
    always while fewer than ``MIN_ROUNDS`` are timed or without ``end`` (Unix seconds: the
    step's end); else only when it ends before ``end``, expected to take as long as the last one
    (``last_s``)."""
    if end is None or timed < MIN_ROUNDS:
        return True
    return (time.time() if now is None else now) + last_s <= end


def rounds_cut(timed: int, rounds: int) -> Optional[str]:
    """What a result's ``rounds_cut`` says when the step's end cut its rounds (``None``: not)."""
    if timed >= rounds:
        return None
    return f"{timed} of {rounds} rounds timed: another would have ended past the step's end"


class VariantRaised(Exception):
    """A call of the ``index``-th function of a timing round raised ``error``."""

    def __init__(self, index: int, error: Exception) -> None:
        super().__init__(f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}")
        self.index = index
        self.error = error


def attributed(index: int, f: Callable[[], Any]) -> Callable[[], Any]:
    """``f``, whose exception names its place in the round (:class:`VariantRaised`)."""

    def call() -> Any:
        try:
            return f()
        except Exception as e:
            raise VariantRaised(index, e) from e

    return call


def raised_in_graph_trees(error: BaseException) -> bool:
    """Whether ``error`` was raised inside torch's CUDA graph trees (``cudagraph_trees.py``)."""
    frames = traceback.extract_tb(error.__traceback__)
    return any(os.path.basename(f.filename) == "cudagraph_trees.py" for f in frames)


def reset_graph_trees() -> None:
    """Drop every CUDA graph tree of this process and Dynamo's compiled code with them: each
    compiled mode compiles again at its next call (from Inductor's caches) and records its graphs
    anew. The trees alone (``reset_cudagraph_trees``) are not enough: it shuts their managers
    down, and a compiled function keeps calling its old manager (``Running CUDAGraph after
    shutdown``); ``torch._dynamo.reset`` drops those functions too."""
    import torch
    from torch._inductor import cudagraph_trees

    cudagraph_trees.reset_cudagraph_trees()
    torch._dynamo.reset()


def time_rounds(problem: Any, fns: Dict[str, Callable[..., Any]], baseline: str, dev: Any,
                rounds: int, end: Optional[float] = None,
                failed: Optional[Dict[str, str]] = None,
                taint: Optional[Dict[str, int]] = None) -> Dict[str, List[Tuple[float, float, float]]]:
    """Per mode (not the baseline), per round: (baseline ms, mode ms, baseline again ms), all of
    a round called in turn in one region on the round's fresh inputs; after ``WARMUP_ROUNDS``
    rounds timed the same way and dropped. With ``end`` (Unix seconds: the step's end), no
    round starts after ``MIN_ROUNDS`` that would end past it, by the last round's duration:
    fewer rounds, a wider interval, and a step that ends in its budget. With ``failed``, a mode
    whose call raises in a round (torch's CUDA graph trees asserted so at the large preset, with
    several graph-capturing modes called in turn) is left out, its error in ``failed``, and the
    round run again without it. The baseline's error ends the step, but once: raised inside
    torch's CUDA graph trees (in session 23 the baseline max-autotune asserted so after 430 s of
    level3/004's measure step, beside other graph-capturing modes), the trees are reset and the
    round is run again after a warm-up round (Dynamo's compiled code is reset with them: every
    mode compiles again, from Inductor's caches; a warm-up round that raised is that warm-up
    round, run once more); when the baseline raises again after that, the
    step ends with the first error (the second in its notes). A counted round timed in a tainted
    region (not exclusive) is timed again, at most ``TAINTED_RETAKES`` times and only when
    another round fits; with ``taint``, its ``retaken`` and ``kept`` count such rounds."""
    import torch

    others = [m for m in fns if m != baseline]
    out: Dict[str, List[Tuple[float, float, float]]] = {m: [] for m in others}
    last_s = 0.0
    r = -WARMUP_ROUNDS
    counts = taint if taint is not None else {}
    trees_error: Optional[BaseException] = None  # the baseline's error that reset the trees
    rewarm = False
    while r < rounds and others:
        if not another_round_fits(r, last_s, end):
            say(f"timed {r} of {rounds} rounds: another would end past the step's end")
            break
        warm = r < 0 or rewarm
        t0 = time.time()
        xs = make_inputs(problem, 10 + r, "normal", dev)
        calls = [fns[baseline]] + [fns[m] for m in others] + [fns[baseline]]
        timed = [attributed(i, functools.partial(f, *xs)) for i, f in enumerate(calls)]
        held: List[Any] = []
        try:
            with torch.no_grad():
                samples = do_bench_interleaved(timed, name="optimize:dispatch-warmup" if warm else f"optimize:dispatch-round-{r}",
                                               prepare_each=timed,
                                               min_calls=ROUND_MIN_CALLS, device=str(dev), regions=held)
        except VariantRaised as e:
            which = "the warm-up round" if warm else f"timing round {r + 1}"
            if failed is None or e.index in (0, len(calls) - 1):
                if trees_error is not None:
                    trees_error.add_note(f"after the trees were reset, {which} raised again: {e}")
                    raise trees_error from None
                if failed is None or not raised_in_graph_trees(e.error):
                    raise e.error from None
                trees_error, rewarm = e.error, True
                reset_graph_trees()
                again = "that warm-up round again" if warm else "a warm-up round, then the round again"
                say(f"{baseline}: raised in {which} inside torch's CUDA graph trees ({e}): the trees and the "
                    f"compiled code reset, {again} (each mode compiles again)")
                continue
            mode = others.pop(e.index - 1)
            out.pop(mode)
            failed[mode] = f"raised in a timing round: {e}"
            say(f"{mode}: left out, it raised in {which}: {e}")
            continue  # the round again, without it
        last_s = time.time() - t0
        fate = None if warm else retake_tainted(held, counts, another_round_fits(r, last_s, end))
        if fate == "retaken":
            say(f"timing round {r + 1} again: its region was not exclusive (tainted)")
            continue
        if fate == "kept":
            say(f"round {r + 1}: kept, timed in a region that was not exclusive (tainted)")
        say("timed a warm-up round" if warm else f"timed round {r + 1} of {rounds} ({len(calls)} calls in turn)")
        if not warm:
            med = paired_round(samples)  # the baseline's median, the others by their paired ratios to it
            for i, m in enumerate(others):
                out[m].append((med[0], med[1 + i], med[-1]))
        if rewarm and r >= 0:
            rewarm = False  # a counted round raised: it comes again, after this warm-up
        else:
            rewarm, r = False, r + 1  # a warm-up round that raised was this one, again
    return out


def choose(baseline: str, per_round: Dict[str, List[Tuple[float, float, float]]]) -> Dict[str, Any]:
    """Speedup per mode with its 95 % interval, the noise floor, and the winner: the fastest
    mode whose interval's lower end clears the floor, else the baseline (``fallback``)."""
    first = next(iter(per_round.values()), [])  # baseline and baseline again are each round's, shared by the modes
    noise = [math.log(c / a) for a, _, c in first]
    floor = noise_floor(noise)
    modes: Dict[str, Any] = {}
    for m, rows in per_round.items():
        logs = [math.log(a / b) for a, b, _ in rows]
        mean, half = mean_half(logs) if len(logs) > 1 else (logs[0] if logs else 0.0, math.inf)
        modes[m] = {"speedup": math.exp(mean), "ci95": [math.exp(mean - half), math.exp(mean + half)],
                    "beyond_noise": mean - half > floor, "per_round": [{"baseline_ms": a, "mode_ms": b, "baseline_again_ms": c}
                                                                      for a, b, c in rows]}
    winners = sorted((v["speedup"], m) for m, v in modes.items() if v["beyond_noise"])
    winner = winners[-1][1] if winners else baseline
    return {"modes": modes, "noise_floor": math.exp(floor), "winner": winner, "fallback": not winners}


def device_profile(compiled: Callable[..., Any], inputs: Sequence[Any], calls: int, name: str) -> Dict[str, Dict[str, float]]:
    """Per name of device work, its launches (``count``) and device time (``us``) per call:
    torch.profiler over ``calls`` calls, in a region named ``name``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with region(name), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            compiled(*inputs)
        torch.cuda.synchronize()
    return device_totals(trace_events(prof), calls)


def device_us(compiled: Callable[..., Any], inputs: Sequence[Any], calls: int, name: str) -> Dict[str, float]:
    """Device time per call by name of device work (:func:`device_profile`)."""
    return {n: t["us"] for n, t in device_profile(compiled, inputs, calls, name).items()}


#: Inductor's names of its generated Triton kernels (pointwise, reduction, persistent, template...).
TRITON_PREFIX = "triton_"


def baseline_profile(fn: Callable[..., Any], xs: Sequence[Any], dev: Any) -> Dict[str, Any]:
    """The compiled baseline's generated Triton kernels' share of its device time (one profile of
    3 calls), for the config agent's Amdahl ceiling before its own step: ``triton_share``, or
    ``why`` there is none (the CPU, or the profile failed: the config step then runs as it would
    without it)."""
    import torch

    if dev.type != "cuda":
        return {"why": "the CPU: Inductor's CPU backend generates no Triton kernels"}
    try:
        with torch.no_grad():
            us = device_us(fn, xs, 3, "optimize:dispatch-profile")
    except Exception as e:  # a profile is advice; the measurement stands without it
        return {"why": f"the profile failed: {type(e).__name__}: {str(e)[:200]}"}
    total = sum(us.values())
    if total <= 0:
        return {"why": "the profile saw no device work"}
    triton = sum(v for n, v in us.items() if n.startswith(TRITON_PREFIX))
    return {"triton_share": triton / total, "device_us": round(total, 2)}


def measure(problem: Any, modes: Sequence[str], dev: Any, rounds: int,
            rewrite: Optional[Sequence[str]] = None, graph_rounds: int = 0, profile_baseline: bool = False,
            until: Optional[float] = None, warm: Optional[WarmSpec] = None, end: Optional[float] = None
            ) -> Dict[str, Any]:
    """The whole agent step: modes prepared and checked (and with ``rewrite``, the exactness
    classes the rewrite agent may use, its variants), timed against ``modes[0]`` (the
    baseline), the choice; with ``graph_rounds``, then per graph (:func:`graph_search`). With
    ``until`` (Unix seconds), variants not prepared by then are left out (``not_prepared``), and
    so are the rewrite and the per-graph search; a compile still running at ``until`` is
    interrupted (:func:`deadline_alarm`). With ``end`` (Unix seconds: the step's end), timing
    rounds past the first two that would end after it are not run (:func:`time_rounds`), and a
    baseline's compile still running then is interrupted (the step fails, naming why). With ``warm`` (``workers`` > 0), compile workers
    warm Inductor's caches ahead of the preparation (:mod:`.warm`)."""
    # every variant, the rewrite agent's two, explain's trace and the per-graph plans
    with room_to_compile(len(modes) + 3 + graph_rounds * MAX_GRAPH_PLANS):
        return measure_in(problem, modes, dev, rounds, rewrite, graph_rounds, profile_baseline, until, warm, end)


@dataclass(frozen=True)
class Graphs:
    """The graphs Dynamo splits the reference's forward into, in the order it compiles them:
    each one's number of ops, why each break happened, and the names of the ops they call
    (lower case: functions, methods and module classes)."""

    ops: List[int]
    breaks: List[str]
    op_names: FrozenSet[str] = frozenset()


def find_graphs(model: Any, xs: Sequence[Any]) -> Graphs:
    """The reference's graphs, by ``torch._dynamo.explain`` (one call on ``xs``; the model itself,
    not a copy: tracing changes nothing in it, and a copy of a large problem's weights would cost
    their size again). Explain resets Dynamo before and after: call it before any variant is
    compiled."""
    import torch
    import torch._dynamo

    with torch.no_grad():
        found = torch._dynamo.explain(model)(*xs)
    calls = ("call_function", "call_method", "call_module")
    ops = [sum(1 for n in g.graph.nodes if n.op in calls) for g in found.graphs]
    # Every graph module's nodes, nested ones too (checkpointed regions, torch.cond branches).
    nested = [m for g in found.graphs for m in g.modules() if hasattr(m, "graph")]
    names = frozenset(op_name(m, n) for m in nested for n in m.graph.nodes if n.op in calls)
    return Graphs(ops, [break_line(r) for r in found.break_reasons], names)


#: The op name of a module call Dynamo did not inline (a module of modules): it could hold any op.
OPAQUE = "?"


def op_name(gm: Any, node: Any) -> str:
    """A node's op in lower case: a function's name, a method's, or a leaf module's class
    (:data:`OPAQUE` for a module holding others)."""
    if node.op == "call_module":
        try:
            sub = gm.get_submodule(node.target)
        except AttributeError:
            return OPAQUE
        return OPAQUE if any(True for _ in sub.children()) and not hasattr(sub, "graph") else type(sub).__name__.lower()
    return str(getattr(node.target, "__name__", node.target)).lower()


def no_effect(variant: str, graphs: Optional[Graphs]) -> Optional[str]:
    """Why a knob variant cannot change what Inductor generates for these graphs, when each of
    its knobs acts only on ops (:data:`KNOB_NEEDS`) that no graph calls; ``None`` when it may (or
    the graphs are not known)."""
    _mode, knobs = variant_knobs(variant)
    if graphs is None or not graphs.op_names or OPAQUE in graphs.op_names or not knobs or "~" in variant:
        return None
    whys = []
    for k in knobs:
        need = KNOB_NEEDS.get(k)
        if need is None or any(word in name for word in need[0] for name in graphs.op_names):
            return None
        whys.append(f"{k}: {need[1]}")
    return "; ".join(whys)


def break_line(reason: Any) -> str:
    """A graph break as one line: the first line of Dynamo's reason and where in the user's code."""
    text = str(getattr(reason, "reason", "") or "").strip()
    line = text.splitlines()[0][:200] if text else "no reason given"
    stack = list(getattr(reason, "user_stack", None) or [])
    return line + (f" ({os.path.basename(stack[-1].filename)}:{stack[-1].lineno})" if stack else "")


def neighbours(plan: Sequence[str], modes: Sequence[str], ops: Sequence[int]) -> List[List[str]]:
    """The plans one graph away from ``plan``: each graph, largest first (by ops), in each other
    mode of ``modes``; at most ``MAX_GRAPH_PLANS``."""
    order = sorted(range(len(plan)), key=lambda g: (-ops[g], g))
    out = [[m if i == g else p for i, p in enumerate(plan)] for g in order for m in modes if m != plan[g]]
    return out[:MAX_GRAPH_PLANS]


def beats(rows: Sequence[Tuple[float, float, float]], current: Sequence[Tuple[float, float, float]],
          floor: float) -> Tuple[float, bool]:
    """A plan against the current one in the same rounds: the geometric mean of current/plan,
    and whether its 95 % interval's lower end clears the rounds' noise floor (a log)."""
    logs = [math.log(c[1] / r[1]) for r, c in zip(rows, current)]
    mean, half = mean_half(logs)
    return math.exp(mean), mean - half > floor


def graph_search(problem: Any, ref: Reference, graphs: Graphs, fns: Dict[str, Callable[..., Any]],
                 result: Dict[str, Any], dev: Any, rounds: int, graph_rounds: int) -> Dict[str, Any]:
    """Per graph, for a forward of several graphs: coordinate descent from the per-problem winner
    over the plain modes that ran and matched. Each round prepares the plans one graph away
    (:func:`neighbours`, each checked as a mode is), times them beside the current plan against the
    baseline, and moves to the fastest that beats the current plan beyond noise in those rounds;
    it stops when none does. A plan the search moved to becomes ``result``'s winner (with its
    timing from its round). Returns what it did (``rounds``, or ``why`` it did nothing)."""
    info: Dict[str, Any] = {"count": len(graphs.ops), "ops": graphs.ops, "breaks": graphs.breaks, "rounds": []}
    baseline, winner = result["baseline"], result["winner"]
    modes = [m for m in fns if m in MODES]
    if len(graphs.ops) < 2:
        return {**info, "why": "one graph: the per-problem choice is the per-graph one"}
    if winner not in MODES:
        return {**info, "why": f"the winner {winner} is not a plain mode: per-graph plans are of plain modes"}
    if len(modes) < 2:
        return {**info, "why": "fewer than two modes ran and matched eager"}
    plan, timing = [winner] * len(graphs.ops), None
    for _ in range(graph_rounds):
        step = graph_round(problem, ref, fns, plan, modes, graphs.ops, baseline, dev, rounds)
        info["rounds"].append(step["round"])
        if step["moved"] is None:
            break
        plan, timing = step["moved"], step["timing"]
    if timing is not None:
        name = plan_name(plan)
        result["modes"][name] = timing
        result.update(winner=name, fallback=False)
    info["plan"] = plan_name(plan)
    return info


def graph_round(problem: Any, ref: Reference, fns: Dict[str, Callable[..., Any]], plan: List[str],
                modes: Sequence[str], ops: Sequence[int], baseline: str, dev: Any, rounds: int) -> Dict[str, Any]:
    """One round of :func:`graph_search`: ``moved`` is the plan it moves to (``None``: stop) with
    its ``timing`` against the baseline; ``round`` what it measured."""
    current = plan_name(plan)
    ready: Dict[str, Callable[..., Any]] = {baseline: fns[baseline], current: fns[current]}
    prepared: Dict[str, Dict[str, Any]] = {}
    for other in neighbours(plan, modes, ops):
        if plan_name(other) not in MODES:  # one mode throughout: measured as that mode already
            prepare_one(plan_name(other), ref.model, ref, dev, ready, prepared)
    record: Dict[str, Any] = {"from": current, "prepared": prepared}
    if not set(ready) - {baseline, current}:
        return {"moved": None, "round": {**record, "why": "no plan one graph away ran and matched eager"}}
    chosen = choose(baseline, time_rounds(problem, ready, baseline, dev, rounds))
    per_round = {m: [(r["baseline_ms"], r["mode_ms"], r["baseline_again_ms"]) for r in v["per_round"]]
                 for m, v in chosen["modes"].items()}
    first = next(iter(per_round.values()))
    mine = per_round[current] if current != baseline else [(a, a, c) for a, _, c in first]  # the baseline's own rows
    floor = math.log(chosen["noise_floor"])
    against = {m: beats(rows, mine, floor) for m, rows in per_round.items() if m != current}
    record.update(noise_floor=chosen["noise_floor"], modes=chosen["modes"],
                  against_current={m: {"speedup": r, "beyond_noise": b} for m, (r, b) in against.items()})
    better = sorted((r, m) for m, (r, b) in against.items() if b)
    if not better:
        return {"moved": None, "round": {**record, "moved_to": None}}
    name = better[-1][1]
    fns[name] = ready[name]
    return {"moved": graph_plan(name) or [name] * len(plan), "timing": chosen["modes"][name],
            "round": {**record, "moved_to": name}}


def compile_workers(warm: Optional[WarmSpec], variants: Sequence[str], dev: Any, hold: bool = False
                    ) -> Tuple[WarmSpec, Optional[Dict[str, Any]]]:
    """The compile workers a measure step starts for ``variants`` (those after the baseline): as
    many as ``warm`` asks, no more than there are variants to warm and, on a GPU, than its free
    memory holds beside the step's (:func:`workers_for_memory`); and what to record of it
    (``None`` when none were asked for; ``held_autotuning`` when ``hold``, the baseline
    autotuning, holds the started workers' autotuning variants until it is prepared)."""
    if warm is None or warm.workers <= 0:
        return WarmSpec("", "", "", 0), None
    n = min(warm.workers, sum(1 for v in variants if warmable(v)))
    said: Dict[str, Any] = {"asked": warm.workers}
    if dev.type == "cuda" and n > 0:
        import torch

        footprint, free = torch.cuda.max_memory_allocated(dev), torch.cuda.mem_get_info(dev)[0]
        held = workers_for_memory(n, footprint, free)
        if held < n:
            said["fewer"] = f"the GPU's free memory ({free / 2**30:.1f} GiB) holds {held} beside the step's {footprint / 2**30:.2f} GiB"
        n = held
    said["started"] = n
    if n and hold and any(autotunes(v) for v in variants if warmable(v)):
        said["held_autotuning"] = True  # (some worker has an autotuning variant to hold)
    if n:
        say(f"{n} compile worker(s) warm Inductor's caches ahead of the preparation"
            + ("; their autotuning variants after the baseline, which autotunes too" if hold else ""))
    return WarmSpec(warm.problem, warm.size, warm.device, n), said


@contextlib.contextmanager
def room_to_compile(variants: int) -> Iterator[None]:
    """Dynamo's recompile limit raised to ``variants`` while they are made and timed. Every
    variant compiles the same ``forward`` (its code object is the class's), each with its own
    backend; past the limit (8 by default) Dynamo stops compiling that frame and runs it eagerly,
    so a ninth variant would be measured as eager under its own name."""
    import torch._dynamo.config as dynamo_config

    names = [n for n in ("recompile_limit", "accumulated_recompile_limit") if hasattr(dynamo_config, n)]
    saved = {n: getattr(dynamo_config, n) for n in names}
    for n in names:
        setattr(dynamo_config, n, max(saved[n], variants))
    try:
        yield
    finally:
        for n, v in saved.items():
            setattr(dynamo_config, n, v)


def rewrite_expected_s(report: Dict[str, Dict[str, Any]], baseline: str) -> float:
    """How long the rewrite's preparation is expected to take, from what was prepared before it:
    ``BASELINE~rewrite`` one compile of the baseline's mode (its first call), ``eager~rewrite``
    no compile (eager's first call where eager was prepared; the baseline's again where it was
    not, the cautious guess). The rules themselves run on the FX graph in well under a second."""
    base = float(report.get(baseline, {}).get("first_call_s") or 0.0)
    if baseline == "eager":
        return base
    return base + eager_rewrite_expected_s(report, baseline)


def eager_rewrite_expected_s(report: Dict[str, Dict[str, Any]], baseline: str) -> float:
    """How long ``eager~rewrite`` alone is expected to take: eager's first call where eager was
    prepared, else the baseline's (the cautious guess)."""
    for variant in ("eager", baseline):
        got = report.get(variant, {}).get("first_call_s")
        if got is not None:
            return float(got)
    return 0.0


class RewriteStep:
    """The rewrite agent's part of a measure step (:func:`prepare_rewrite`), run after the
    baseline is prepared: after every mode, or in a bounded step before the autotuning compiles
    (:func:`prepare_modes`' ``before_autotuning``), which at the large preset can outlast the step
    and used to leave the rewrite out. Against an autotuning baseline too: its ``BASELINE~rewrite``
    then autotunes, but the rule that fired is what won where one did (at the default preset the
    rewrite won 5 of level 3's 10 improvements, up to 3.97x, the knob variants 3, up to 1.31x),
    and at the large preset against max-autotune both level-3 problems whose rule had won at the
    default preset (a decoder layer's attention, a top-2 MoE) had the rewrite cut by those
    compiles."""

    def __init__(self, problem: Any, ref: Reference, baseline: str, classes: Optional[Sequence[str]],
                 dev: Any, late: Callable[[float], bool]) -> None:
        self.problem, self.ref, self.baseline, self.classes, self.dev, self.late = problem, ref, baseline, classes, dev, late
        self.proposed: Optional[Dict[str, Any]] = None
        #: ``BASELINE~rewrite`` when only ``eager~rewrite`` fitted before the deadline.
        self.left_out: Optional[str] = None
        #: The compile workers running beside it (the early rewrite: they compile the autotuning
        #: variants meanwhile), stopped when it runs out of GPU memory beside them.
        self.workers: Optional[CompileWorkers] = None

    def run(self, ready: Dict[str, Callable[..., Any]], report: Dict[str, Dict[str, Any]]) -> Optional[Dict[str, Any]]:
        """What the agent proposed; None when it was not asked for or would end past the deadline
        (:func:`rewrite_expected_s`). When both variants would end past it but ``eager~rewrite``
        alone would not (it compiles nothing), that one alone (``left_out`` names the other)."""
        if self.classes is None or self.baseline not in ready:
            return None
        modes = ["eager", self.baseline]
        if self.late(rewrite_expected_s(report, self.baseline)):
            if self.late(eager_rewrite_expected_s(report, self.baseline)):  # (an eager baseline: the same time)
                return None
            modes, self.left_out = ["eager"], self.baseline + REWRITE
        try:
            self.proposed = prepare_rewrite(self.problem, self.ref, self.baseline, self.classes, self.dev, ready, report,
                                            modes=modes)
            if self.workers is not None and self.workers.count and any(
                    out_of_memory(str(p.get("why", ""))) for v, p in report.items() if v.endswith(REWRITE)):
                import torch

                say("the rewrite ran out of GPU memory beside the compile workers: they are stopped, it is prepared again")
                self.workers.stop()
                torch.cuda.empty_cache()
                self.forget(ready, report)
                self.proposed = prepare_rewrite(self.problem, self.ref, self.baseline, self.classes, self.dev, ready,
                                                report, modes=modes)
                for variant in [v for v in report if v.endswith(REWRITE)]:
                    report[variant]["retried_alone"] = True
        except StepDeadline:  # interrupted: none of its variants is timed without what it proposed
            self.forget(ready, report)
            raise
        return self.proposed

    @staticmethod
    def forget(ready: Dict[str, Callable[..., Any]], report: Dict[str, Dict[str, Any]]) -> None:
        """The rewrite's variants out of both dicts."""
        for variant in [v for v in report if v.endswith(REWRITE)]:
            ready.pop(variant, None)
            del report[variant]

    def prepare(self, ready: Dict[str, Callable[..., Any]], report: Dict[str, Dict[str, Any]]) -> None:
        """:meth:`run` as :func:`prepare_modes` calls it (on its own dicts)."""
        self.run(ready, report)


def measure_in(problem: Any, modes: Sequence[str], dev: Any, rounds: int,
               rewrite: Optional[Sequence[str]], graph_rounds: int = 0, profile_baseline: bool = False,
               until: Optional[float] = None, warm: Optional[WarmSpec] = None, end: Optional[float] = None
               ) -> Dict[str, Any]:
    """:func:`measure` with room to compile every variant."""

    def late(ahead: float = 0.0) -> bool:
        """Whether work expected to take ``ahead`` seconds would end past ``until``."""
        return until is not None and time.time() + ahead > until

    baseline = modes[0]
    same = duplicates(modes)
    modes = [m for m in modes if m not in same]
    ref = reference(problem, dev)
    graphs = find_graphs(ref.model, ref.xs) if graph_rounds > 0 else None  # before any compile: explain resets Dynamo
    idle = {v: why for v in modes for why in [no_effect(v, graphs)] if why}
    to_prepare = [m for m in modes if m not in idle]
    if until is not None:  # bounded: what fits first, the long autotuning compiles last
        to_prepare = to_prepare[:1] + sorted(to_prepare[1:], key=compile_class)
    # A baseline that autotunes: the workers' autotuning variants wait for it (prepare_modes
    # releases them), or they would benchmark its choices again beside its compile.
    hold = autotunes(baseline)
    spec, workers_said = compile_workers(warm, to_prepare[1:], dev, hold)
    rewriting = RewriteStep(problem, ref, baseline, rewrite, dev, late)
    early = rewriting.prepare if until is not None else None
    with CompileWorkers(spec, to_prepare[1:], hold_autotuning=hold) as workers:
        rewriting.workers = workers
        fns, report = prepare_modes(ref, to_prepare, dev, until, workers if workers.count else None, end, early)
    rewriting.workers = None  # stopped: the rewrite prepared after them runs alone
    report.update({v: {"ok": True, "no_effect": why} for v, why in idle.items()})
    if baseline not in fns:
        why = str(report[baseline].get("why", "its output differs from eager"))
        raise DispatchError(f"the baseline {baseline!r} " + ("was not prepared in time: " if why.startswith(BASELINE_PAST_END)
                                                              else "does not run: ") + why)
    proposed = rewriting.proposed if early is not None else rewriting.run(fns, report)
    cut = sorted(v for v, p in report.items() if p.get("not_prepared"))
    result: Dict[str, Any] = {"baseline": baseline, "prepared": report, "rewrite": proposed, "duplicates": same}
    if getattr(dev, "type", str(dev)) == "cuda" and measures_cuda_graphs(modes):
        result["input_bytes"] = input_bytes(ref.xs)
    if workers_said is not None:
        result["compile_workers"] = workers_said
    if until is not None:
        result["prepare_until"] = until
    if end is not None:
        result["until"] = end
    if rewrite is not None and proposed is None:
        cut.append("the rewrite")
    elif rewriting.left_out is not None and proposed is not None and proposed.get("fired"):
        cut.append(rewriting.left_out)
    if len(fns) < 2:
        why = "no mode besides the baseline runs and matches eager"
        alike = sorted(v for v, p in report.items() if p.get("same_code_as"))
        if alike:
            why += f"; not timed, generating the code of a variant with fewer knobs: {', '.join(alike)}"
        if idle:
            why += f"; not compiled, no op for the knob to act on: {', '.join(sorted(idle))}"
        if proposed is not None and not proposed["fired"]:
            why += f"; rewrite: {proposed['why']}"
        if cut:
            why += f"; not prepared, the step's deadline came first: {', '.join(cut)}"
        result.update({"modes": {}, "noise_floor": None, "winner": baseline, "fallback": True, "why": why})
    else:
        failed: Dict[str, str] = {}
        taint: Dict[str, int] = {}
        per_round = time_rounds(problem, fns, baseline, dev, rounds, end, failed, taint)
        if taint.get("retaken") or taint.get("kept"):
            result["tainted_rounds"] = taint
        for v, why in failed.items():  # left out as a variant that fails to run is
            fns.pop(v, None)
            report[v] = {**report.get(v, {}), "ok": False, "why": why}
        if per_round:
            result.update(choose(baseline, per_round))
        else:
            result.update({"modes": {}, "noise_floor": None, "winner": baseline, "fallback": True,
                           "why": "every mode besides the baseline raised in a timing round: "
                                  + "; ".join(f"{v}: {why}" for v, why in sorted(failed.items()))})
        timed = max((len(m["per_round"]) for m in result["modes"].values()), default=rounds)
        if cut_rounds := rounds_cut(timed, rounds):
            result["rounds_cut"] = cut_rounds
        if graphs is not None and not late():  # its plans compile: the preparation's deadline
            result["graphs"] = graph_search(problem, ref, graphs, fns, result, dev, rounds, graph_rounds)
        elif graphs is not None:
            cut.append("the per-graph search")
    if profile_baseline:  # after every timed round: the profiler is not loaded while they run
        result["baseline_profile"] = baseline_profile(fns[baseline], ref.xs, dev)
    if cut:
        result["not_prepared"] = cut
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kforge.optimize.dispatch")
    ap.add_argument("problem")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", help="cpu or cuda (cuda:N)")
    ap.add_argument("--size", default="default", choices=SIZES)
    ap.add_argument("--modes", default="eager,default,max-autotune,max-autotune-no-cudagraphs,reduce-overhead")
    ap.add_argument("--knobs", default="", help=f"Inductor knobs to try on the baseline's mode (of: {', '.join(KNOBS)})")
    ap.add_argument("--rewrite", default="", metavar="CLASSES",
                    help="the rewrite agent (the forward rewritten by the rules, as eager~rewrite and BASELINE~rewrite) "
                         f"with the exactness classes it may use, comma-separated (of: {', '.join(EXACTNESS)}; "
                         f"kforge optimize passes {','.join(REWRITE_CLASSES)}); empty: off")
    ap.add_argument("--graph-rounds", type=int, default=0, metavar="N",
                    help="for a forward of several graphs (graph breaks): up to N rounds of per-graph plans "
                         f"(graphs:M0/M1/..., coordinate descent from the winner; kforge optimize passes {GRAPH_ROUNDS} "
                         "with the dispatch agent); 0: off")
    ap.add_argument("--profile-baseline", type=int, choices=(0, 1), default=0,
                    help="1: profile the compiled baseline once and record its Triton kernels' share of device time "
                         "(kforge optimize passes 1 with the config agent on a GPU: its Amdahl ceiling before its step)")
    ap.add_argument("--baseline", default="max-autotune")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--compile-workers", type=int, default=0, metavar="N",
                    help="start N processes that compile the variants ahead of the preparation into Inductor's caches "
                         "(kforge optimize passes what the cores hold beside the problems in flight); 0: none")
    ap.add_argument("--warm-only", default=None, metavar="VARIANTS",
                    help="be a compile worker: prepare these variants (comma-separated), print a JSON line as each is "
                         "done, time nothing, write no result")
    ap.add_argument("--hold-autotuning", action="store_true",
                    help="with --warm-only: prepare the variants that do not autotune first, then wait for a line on "
                         "stdin (or its end) before those that do (the measure step passes it when its baseline "
                         "autotunes and writes the line once that baseline is prepared: autotuned after it, they find "
                         "its autotune results in Inductor's caches instead of benchmarking them again beside it)")
    ap.add_argument("--prepare-until", type=float, default=None, metavar="UNIX_S",
                    help="prepare no variant but the baseline after this time (Unix seconds), interrupting a compile "
                         "still running then; those left are recorded as not prepared and not timed (kforge optimize "
                         "passes it to a measure step no wall budget of its size holds, so that the step ends inside it, "
                         "and as a safety net to every measure step under a wall budget)")
    ap.add_argument("--until", type=float, default=None, metavar="UNIX_S",
                    help="the step's end (Unix seconds): no timing round past the first two that would end after it; "
                         "a baseline compile still running then is interrupted and the step fails (kforge optimize "
                         "passes it with --prepare-until)")
    a = ap.parse_args(argv)
    try:
        if a.rounds < 2:
            raise DispatchError(f"--rounds must be at least 2 (an interval needs two rounds), got {a.rounds}")
        if a.graph_rounds < 0:
            raise DispatchError(f"--graph-rounds must be 0 (off) or more, got {a.graph_rounds}")
        if a.compile_workers < 0:
            raise DispatchError(f"--compile-workers must be 0 (none) or more, got {a.compile_workers}")
        if a.until is not None and a.prepare_until is not None and a.until < a.prepare_until:
            raise DispatchError(f"--until ({a.until:.3f}) comes before --prepare-until ({a.prepare_until:.3f}): "
                                "the step's end must not come before its preparation's")
        rewrite = a.rewrite != ""
        # A compile worker is given its variants (the step checked them).
        modes = parse_modes(a.modes, a.baseline, "cpu" if a.device == "cpu" else "cuda", a.knobs, rewrite) \
            if a.warm_only is None else []
        classes = [c.strip() for c in a.rewrite.split(",") if c.strip()]
        try:
            if rewrite:
                rules_of(classes)
        except ValueError as e:
            raise DispatchError(f"--rewrite: {e}") from e
        try:
            import torch
        except ImportError as e:
            raise DispatchError(f"torch is not importable here ({e})") from e
        if a.device != "cpu" and not torch.cuda.is_available():
            raise DispatchError(f"--device {a.device} but no CUDA GPU is visible (pass --device cpu)")
        problem = load_problem(a.problem, a.size)
        inductor_regions()  # under a daemon, max-autotune's own benchmarks run in regions
        if a.warm_only is not None:
            warm_only(problem, [v for v in a.warm_only.split(",") if v], torch.device(a.device), a.hold_autotuning)
            return 0
        warm = WarmSpec(a.problem, a.size, a.device, a.compile_workers)
        result = measure(problem, modes, torch.device(a.device), a.rounds, classes if rewrite else None, a.graph_rounds,
                         bool(a.profile_baseline), a.prepare_until, warm, a.until)
    except DispatchError as e:
        print(f"kforge optimize: {e}", file=sys.stderr)
        return 2
    result.update(problem=a.problem, size=a.size, device=a.device, agent="dispatch",
                  versions={"torch": torch.__version__, "triton": triton_version()}, tf32=tf32_flags(torch))
    with open(a.out, "w") as f:
        json.dump(finite_json(result), f, indent=1, allow_nan=False)
    return 0


def tf32_flags(torch: Any) -> Dict[str, Any]:
    """Whether cuDNN and cuBLAS may use TF32 in this process (the measurement ran so); where
    torch refuses the legacy flags (a problem set the newer ``fp32_precision`` API: reading them
    then raises), what it said instead."""
    try:
        return {"cudnn": bool(torch.backends.cudnn.allow_tf32), "cublas": bool(torch.backends.cuda.matmul.allow_tf32)}
    except RuntimeError as e:
        return {"unreadable": str(e).splitlines()[0][:200] if str(e) else "RuntimeError"}


def triton_version() -> Optional[str]:
    try:
        import triton
    except ImportError:
        return None
    return str(triton.__version__)


if __name__ == "__main__":
    run_then_leave(main, "dispatch")
