"""The re-stitch round trip of ``kforge inspect`` (GPU): a fresh compile of the problem with every
Triton kernel replaced by one compiled from its own source, checked bit for bit against an
unmodified compile and timed against it in interleaved rounds.

torch is imported inside the functions that use it (the capture's entry point must start without
torch, to report its absence).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..bench import do_bench_interleaved
from ..harness import clone_output, identical, max_abs_diff, mean_half, noise_floor, to_device
from .inductor import (
    CUDA_GRAPH_MODES,
    WrapperHook,
    compile_kernel,
    kernel_sources,
    launcher_kinds,
    own_code_class,
    pin_config,
    triton_globals,
)
from .traces import profile_pair


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def compile_problem(problem: Any, mode: str, dev: Any, second: bool = False) -> Tuple[Any, Any, List[Any]]:
    """(model, torch.compile'd model, inputs). ``second``: a compile beside the current one — no
    Dynamo reset, and the model of a subclass of ``Model`` whose ``forward`` is a copy on a new
    code object: Dynamo caches per code object, so the two compiled models neither share a cache
    entry (instances of one class may) nor pay for each other's guards (entries on one code
    object are tried in turn: the timing would favour one of them)."""
    import torch

    cls = problem.Model
    if second:
        cls = own_code_class(cls)
    else:
        torch._dynamo.reset()
    # Built and drawn on the device (torch's default device there): at the large preset a host
    # draw of the inputs and its copy took 7-50 s per input set on the H200, on the GPU milliseconds.
    with torch.device(dev):
        torch.manual_seed(0)
        model = cls(*[to_device(x, dev) for x in problem.get_init_inputs()]).to(dev).eval()
        torch.manual_seed(1)
        inputs = [to_device(x, dev) for x in problem.get_inputs()]
    # Static shapes: a replacement kernel is specialized to the shapes it was generated for.
    return model, torch.compile(model, mode=mode, dynamic=False), inputs


def _median(xs: List[Optional[float]]) -> Optional[float]:
    vals = sorted(x for x in xs if x is not None)
    return vals[len(vals) // 2] if vals else None


#: Timed calls of each side per round at least: a launch-bound model of 15 ms per call got one
#: call per side per round from 50 ms of calls, and its noise floor was that one call's jitter.
ROUND_MIN_CALLS = 15


#: The noise floor the round trip aims at: when its first rounds leave it above this, it times
#: ``MORE_ROUNDS`` more (once), each with twice the calls. The floor is the upper end of a 95 %
#: interval over the rounds: its half width falls with their number (Student's t at 4 degrees of
#: freedom is 2.78, at 9 it is 2.26) and with each round's spread, which falls with its calls. bf16
#: GEMMs at the large preset, whose calls spread by a few percent at the power limit, left floors
#: of 1.015–1.019 after 5 rounds (issue 17 item 6). One extension, not rounds until the floor is
#: met: stopping as soon as an interval is narrow enough would report floors narrower than the
#: timing is.
FLOOR_GOAL = 1.01
MORE_ROUNDS = 5


def interleaved_ratio(time_round: Callable[[], Tuple[float, float, float]], rounds: int = 5,
                      more_rounds: int = MORE_ROUNDS, floor_goal: float = FLOOR_GOAL,
                      time_more_round: Optional[Callable[[], Tuple[float, float, float]]] = None) -> Dict[str, Any]:
    """new/base over rounds of ``time_round()`` → (base, new, base again) in ms: the geometric-mean
    ratio with its 95 % interval, and the noise floor — the upper end of that interval for
    base-again/base. ``within_noise``: the ratio's interval reaches into the band the baseline
    shows against itself. ``rounds`` rounds, then ``more_rounds`` more, of ``time_more_round()``
    (default ``time_round``), when the floor they give is above ``floor_goal`` (``extended``)."""
    per_round: List[Dict[str, float]] = []
    logs: List[float] = []
    noise: List[float] = []

    def one_round(timed: Callable[[], Tuple[float, float, float]]) -> None:
        tb, tn, tb2 = timed()
        per_round.append({"base_ms": tb, "new_ms": tn, "base_again_ms": tb2})
        logs.append(math.log(tn / tb))
        noise.append(math.log(tb2 / tb))

    for _ in range(max(2, rounds)):
        one_round(time_round)
    extended = more_rounds > 0 and math.exp(noise_floor(noise)) > floor_goal
    for _ in range(more_rounds if extended else 0):
        one_round(time_more_round or time_round)
    mean, half = mean_half(logs)
    floor = noise_floor(noise)
    return {"ratio": math.exp(mean), "ratio_ci95": [math.exp(mean - half), math.exp(mean + half)], "noise_floor": math.exp(floor),
            "within_noise": mean - half <= floor and mean + half >= -floor, "per_round": per_round, "extended": extended}


def _round_ms(base: Callable[[], Any], new: Callable[[], Any], calls: int = 1) -> Tuple[float, float, float]:
    """Baseline, re-stitched and baseline again, call by call in turn in one region (about 50 ms
    of calls, at least ``ROUND_MIN_CALLS`` of each: the round trip takes 5 or 10 rounds, in regions that
    on a shared GPU hold every other job).
    Every timed call follows an untimed call of the same function: without CUDA graphs the two
    are one model whose kernels are switched in its wrapper module, and a call right after the
    switch runs on CPU caches warmed by the other kernels — on the H200 host-bound GRU and LSTM
    models (64 kernels) timed 9–13 % slower with replacements so timed, at the same device time
    and the same host time per call when called in a row. ``calls``: that many times the calls
    (an extension round of ``interleaved_ratio``)."""
    a, b, c = do_bench_interleaved([base, new, base], warmup=10, rep=50 * calls, name="inspect:round-trip",
                                   prepare_each=[base, new, base], min_calls=ROUND_MIN_CALLS * calls)
    return statistics.median(a), statistics.median(b), statistics.median(c)


def swapping(kernels: Sequence[Tuple[Any, str, Any, Any]], call: Callable[[], Any]) -> Tuple[Callable[[], Any], Callable[[], Any]]:
    """Two ways to call one compiled model: with its original kernels, and with their replacements
    — each (module, name, original, replacement) set in the wrapper module first (the wrapper
    looks its kernels up there at every call). Without CUDA graphs the round trip times these
    against each other: one compile, so nothing but the kernels differs."""
    def with_originals() -> Any:
        for mod, name, old, _new in kernels:
            setattr(mod, name, old)
        return call()

    def with_replacements() -> Any:
        for mod, name, _old, new in kernels:
            setattr(mod, name, new)
        return call()

    return with_originals, with_replacements


def restitch_round_trip(path: str, problem: Any, mode: str, dev: Any, expected: Any) -> Dict[str, Any]:
    """Two fresh compiles, the baseline and a second one beside it; after the second one's first
    call (which loads the wrapper and, with CUDA graphs, only warms up) every Triton kernel is
    replaced by one compiled from its own source, restricted to an autotuned configuration; the
    next calls (and any CUDA graph recorded then) use the replacements. Outputs must equal those
    of an unmodified compile bit for bit (the second compile's first call, or the baseline's);
    also reported: against the first compile of the capture. Then timed in interleaved rounds —
    without CUDA graphs against the same compile with its original kernels (replacements pinned
    to those originals' configurations), with CUDA graphs against the baseline compile
    (replacements pinned to the baseline's) — and, beyond noise, both profiled to say why."""
    import torch

    base_model, base, inputs = compile_problem(problem, mode, dev)
    with torch.no_grad():
        with WrapperHook() as base_hook:
            base_out = clone_output(base(*inputs))
        # The baseline's kernels, autotuned by that first call: under CUDA graphs a replacement
        # whose source the baseline also has runs the baseline's configuration. Kernels autotuned
        # at their first call choose again in every compile (two compiles of one model differed by
        # up to 12 % on the H200): pinned to the second compile's own choice, the comparison with
        # the baseline would time that, not the swap.
        base_by_source: Dict[str, Any] = {}
        for bm in base_hook.modules:
            bsrc = kernel_sources(_read(bm.__file__))
            for name, k in triton_globals(bm).items():
                if name in bsrc:
                    base_by_source[bsrc[name]] = k
        _model, compiled, inputs2 = compile_problem(problem, mode, dev, second=True)
        with WrapperHook(private_from=base_hook.modules) as hook:
            # This compile's own output is the reference: a fresh compile may autotune another
            # configuration (another reduction order) than the first one did.
            fresh = clone_output(compiled(*inputs2))
        to_baseline = 0
        unpinned: Dict[str, str] = {}
        not_swapped: List[str] = []
        pairs: List[Tuple[Any, str, Any, Any]] = []
        found = [(mod, name, old, src) for mod in hook.modules for src_map in [kernel_sources(_read(mod.__file__))]
                 for name, old in triton_globals(mod).items() for src in [src_map.get(name)] if src is not None]
        # Timed against the other compile (CUDA graphs): run its configurations — if it has every
        # kernel source (a mix of its and this compile's configurations would match neither's
        # output bit for bit). Timed against this compile's own originals (no graphs): run theirs.
        to_base = mode in CUDA_GRAPH_MODES and bool(found) and all(src in base_by_source for *_, src in found)
        for mod, name, old, src in found:
            # A trailing comment makes the source new to Inductor's compiled-kernel cache, so a
            # new kernel object is built from it (Triton's own disk cache may reuse the binary).
            new = compile_kernel(name, src + "\n# kforge re-stitch round trip\n")
            why_not = pin_config(new, base_by_source[src] if to_base else old)
            if why_not is None:
                to_baseline += int(to_base)
            else:
                unpinned[name] = why_not
                if why_not.startswith("half-pinned"):  # another comment: another cache entry
                    new = compile_kernel(name, src + "\n# kforge re-stitch round trip, unpinned\n")
            if why_not is not None and mode in CUDA_GRAPH_MODES:
                # It would autotune on its first call — inside the CUDA-graph recording, where
                # that is not allowed: keep the original, and say so.
                not_swapped.append(name)
                continue
            setattr(mod, name, new)
            pairs.append((mod, name, old, new))
        for _ in range(3):
            out = clone_output(compiled(*inputs2))  # cudagraph trees record here, with the replacements
        torch.cuda.synchronize()
        # Inductor caches a wrapper module by its file: two compiles generating the same code may
        # share one, and then the baseline runs the replacements too — nothing to compare.
        shared = [m.__name__ for m in hook.modules if any(m is b for b in base_hook.modules)]
        timing: Dict[str, Any]
        first: Optional[Callable[[], Any]]
        second: Optional[Callable[[], Any]]
        if mode not in CUDA_GRAPH_MODES and pairs:
            # No CUDA graphs: the wrapper looks its kernels up at every call, so one compile is
            # timed with its original kernels against itself with the replacements.
            first, second = swapping(pairs, lambda: compiled(*inputs2))
            timed_against = "the same compile with its original kernels"
        elif shared or not base_hook.modules:
            first = second = None
            timed_against = (f"the baseline shares wrapper modules {shared} with the re-stitched compile" if shared
                             else "the baseline's wrapper modules were not seen")
        else:
            # CUDA graphs are recorded once, with the replacements: the baseline is the other
            # compile, whose configurations the replacements run (when it has every kernel).
            first, second = (lambda: base(*inputs)), (lambda: compiled(*inputs2))
            timed_against = ("the baseline compile, the second one unmodified (nothing replaced)" if not pairs
                             else "the baseline compile (replacements pinned to its configurations)" if to_base
                             else "the baseline compile (replacements pinned to the second compile's configurations)")
        if first is None or second is None:
            timing = {"ratio": None, "within_noise": None, "per_round": [], "timing_skipped": timed_against}
        else:
            a, b = first, second
            try:
                timing = interleaved_ratio(lambda: _round_ms(a, b), time_more_round=lambda: _round_ms(a, b, calls=2))
                timing["timed_against"] = timed_against
                if timing.get("within_noise") is False:
                    # Beyond noise: say why — which device work or host time differs per call.
                    try:
                        timing["difference"] = profile_pair(a, b)
                    except Exception as e:  # the explanation is evidence, not the result
                        timing["difference"] = {"why": f"not profiled: {type(e).__name__}: {e}"}
            finally:
                for mod, name, _old, new in pairs:  # leave the model re-stitched
                    setattr(mod, name, new)
    # Evidence for the host-time side of a difference: how the originals and replacements launch.
    timing["launchers"] = {"original": launcher_kinds([old for _m, _n, old, _new in pairs]),
                           "replacement": launcher_kinds([new for _m, _n, _old, new in pairs])}
    rounds = timing["per_round"] or [{"base_ms": None, "new_ms": None}]
    # Identical to an unmodified compile: the second one's own output, or — replacements running
    # the baseline's configurations (its reduction order) — the baseline's.
    identical_to = "second compile" if identical(out, fresh) else "baseline" if identical(out, base_out) else None
    return {"kernels_replaced": len(pairs), "configs_pinned": not unpinned, "pinned_to_baseline": to_baseline, "unpinned": unpinned,
            "not_replaced_unpinned": not_swapped, "identical": identical_to is not None, "identical_to": identical_to,
            "max_abs_diff": max_abs_diff(out, fresh), "max_abs_diff_to_baseline": max_abs_diff(out, base_out),
            "identical_to_first_compile": identical(out, expected),
            "max_abs_diff_to_first_compile": max_abs_diff(out, expected),
            "baseline_ms": _median([r["base_ms"] for r in rounds]), "restitched_ms": _median([r["new_ms"] for r in rounds]),
            **timing}
