"""The re-stitch round trip of ``kforge inspect`` (GPU): a fresh compile of the problem with every
Triton kernel replaced by one compiled from its own source, checked bit for bit against an
unmodified compile and timed against it in interleaved rounds.

torch is imported inside the functions that use it (the capture's entry point must start without
torch, to report its absence).
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..bench import do_bench_interleaved
from ..harness import (
    MEDIAN_SE,
    clone_output,
    identical,
    max_abs_diff,
    mean_half,
    noise_floor,
    pair_spread,
    paired_log,
    t95,
    to_device,
)
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


#: Timed calls of each side in the first round at least: a launch-bound model of 15 ms per call
#: got one call per side per round from 50 ms of calls, and its noise floor was that call's jitter.
ROUND_MIN_CALLS = 15

#: The noise floor the rounds are sized for (the upper end of the 95 % interval of the baseline
#: timed against itself): under issue 17's goal of 1.01, since the floor is itself a random
#: quantity.
FLOOR_AIM = 1.006
#: Rounds at least and at most; each round is one exclusive region of at most ``ROUND_MAX_S``
#: (as the first round's time per call predicts it), so the round trip's timing takes at most
#: ``MAX_ROUNDS * ROUND_MAX_S`` of regions.
MIN_ROUNDS = 5
MAX_ROUNDS = 20
ROUND_MAX_S = 3.0
Samples = Tuple[List[float], List[float], List[float]]


def round_plan(calls: int, spread: float, seconds: float, aim: float = FLOOR_AIM) -> Tuple[int, int]:
    """(rounds, calls of each side per round) after a first round of ``calls`` calls of each side
    whose paired log ratios spread by ``spread`` and which took ``seconds``: the fewest rounds
    (at least MIN_ROUNDS) whose calls, each round within ROUND_MAX_S, bring the predicted floor
    to ``aim`` — t(rounds) * MEDIAN_SE * spread / sqrt(rounds * calls) <= log(aim) — else
    MAX_ROUNDS of the most calls a round fits. Sized by the spread alone, never by the ratios
    seen: rounds timed until a floor looks narrow enough would report it narrower than it is."""
    per_call_s = seconds / max(1, calls)
    fits = max(calls, int(ROUND_MAX_S / per_call_s)) if per_call_s > 0 else calls
    half = math.log(aim)
    for rounds in range(MIN_ROUNDS, MAX_ROUNDS + 1):
        need = math.ceil((t95(rounds) * MEDIAN_SE * spread / half) ** 2 / rounds)
        if need <= fits:
            return rounds, max(calls, need)
    return MAX_ROUNDS, fits


def rounds_for(logs: Sequence[float], noise: Sequence[float], aim: float = FLOOR_AIM) -> int:
    """Rounds in all that the first rounds' spread asks for (Stein's two stages: the spread of
    the rounds so far, never their mean): the larger standard deviation of the rounds' new/base
    and base-again/base logs, s, over ``len(logs)`` rounds gives t(those rounds) * s / sqrt(N)
    <= log(aim) at N rounds. Rounds differ by more than their calls explain when a machine's
    state moves between them (session 31: host-bound rounds 3-8 % apart at 120-240 calls each)."""
    s = max(statistics.stdev(logs), statistics.stdev(noise)) if len(logs) > 1 else 0.0
    return max(len(logs), math.ceil((t95(len(logs)) * s / math.log(aim)) ** 2))


def interleaved_ratio(time_round: Callable[[int], Tuple[Samples, float]], aim: float = FLOOR_AIM) -> Dict[str, Any]:
    """new/base over rounds of ``time_round(calls)`` → ((base, new, base again) samples of the
    calls in the order made, the round's seconds): per round the median of the paired log ratios
    (:func:`paired_log`); over the rounds the geometric-mean ratio with its 95 % interval, and the
    noise floor — the upper end of that interval for base-again/base. ``within_noise``: the
    ratio's interval reaches into the band the baseline shows against itself. The first round
    (at least ROUND_MIN_CALLS calls of each side) sizes the others' calls and rounds
    (:func:`round_plan`: the calls' spread); after MIN_ROUNDS, the rounds' own spread may ask for
    more rounds (:func:`rounds_for`), at most MAX_ROUNDS in all."""
    per_round: List[Dict[str, Any]] = []
    logs: List[float] = []
    noise: List[float] = []

    def one_round(calls: int) -> Tuple[Samples, float]:
        (a, b, c), seconds = time_round(calls)
        logs.append(paired_log(a, b))
        noise.append(paired_log(a, c))
        per_round.append({"base_ms": statistics.median(a), "new_ms": statistics.median(b),
                          "base_again_ms": statistics.median(c), "calls": min(len(a), len(b), len(c)),
                          "new_over_base": math.exp(logs[-1]), "again_over_base": math.exp(noise[-1])})
        return (a, b, c), seconds

    (a, b, c), seconds = one_round(ROUND_MIN_CALLS)
    spread = pair_spread(a, b, c)
    planned, calls = round_plan(per_round[0]["calls"], spread, seconds, aim)
    for _ in range(MIN_ROUNDS - 1):
        one_round(calls)
    asked = rounds_for(logs, noise, aim)
    rounds = min(MAX_ROUNDS, max(planned, asked))
    for _ in range(rounds - MIN_ROUNDS):
        one_round(calls)
    mean, half = mean_half(logs)
    floor = noise_floor(noise)
    return {"ratio": math.exp(mean), "ratio_ci95": [math.exp(mean - half), math.exp(mean + half)], "noise_floor": math.exp(floor),
            "within_noise": mean - half <= floor and mean + half >= -floor, "per_round": per_round,
            "plan": {"first_round_calls": per_round[0]["calls"], "first_round_s": seconds, "spread": spread,
                     "rounds": rounds, "calls": calls, "rounds_by_calls": planned, "rounds_by_rounds": asked,
                     "floor_aim": aim}}


def _round_samples(base: Callable[[], Any], new: Callable[[], Any], calls: int) -> Tuple[Samples, float]:
    """Baseline, re-stitched and baseline again, call by call in turns of the three in a new order
    each (``shuffle``), in one region (about 50 ms of calls, at least ``calls`` of each), with the
    seconds the region was held.
    Every timed call follows an untimed call of the same function: without CUDA graphs the two
    are one model whose kernels are switched in its wrapper module, and a call right after the
    switch runs on CPU caches warmed by the other kernels — on the H200 host-bound GRU and LSTM
    models (64 kernels) timed 9–13 % slower with replacements so timed, at the same device time
    and the same host time per call when called in a row."""
    held: List[Any] = []
    t0 = time.monotonic()
    a, b, c = do_bench_interleaved([base, new, base], warmup=10, rep=50, name="inspect:round-trip",
                                   prepare_each=[base, new, base], min_calls=calls, regions=held, shuffle=True)
    seconds = time.monotonic() - t0  # the wait for the region too, where it held none
    if held and held[0].held_ms is not None:
        seconds = held[0].held_ms / 1e3
    return (a, b, c), seconds


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
                timing = interleaved_ratio(lambda calls: _round_samples(a, b, calls))
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
