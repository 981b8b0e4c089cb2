"""Gate 4 of ``kforge verify`` (GPU only): interleaved timing against the compiled baseline.

Per round, fresh inputs; baseline, candidate and baseline again are timed call by call in turn
with ``kforge.do_bench_interleaved`` (L2 flushed per call; one kforge region per round when run
as a kforge job), so that a drift of the machine falls on all three alike. The
speedup is the geometric mean of baseline/candidate over rounds with a 95 % confidence interval
(t over log ratios); the noise floor is the upper end of the same interval for baseline-again/
baseline (how far the baseline, timed twice, can seem to differ from itself). Accepted only when the
speedup interval's lower end is beyond the noise floor; every round's times are in the evidence. Plausibility: the bytes the candidate
must at least move (its inputs and outputs) over its time must not exceed the device's measured
copy bandwidth — faster than that is "does less work".

The timed calls' outputs are validated too: in every round a random sample of the candidate's
timed calls (``TIMED_SAMPLES``, reservoir-sampled over all its calls of the round, so that any
call can be picked and the candidate cannot tell which) keeps its output — copied in the next
``before_each``, outside the timed interval — with the input set it had; after the round each is
compared with the reference's output for that set (``exploits:revalidation-timed``). After the
last round the candidate is validated once more on fresh inputs
(``exploits:revalidation-after-timing``). A candidate that computes less once it is being timed,
or after N calls, is rejected instead of timed as faster.

torch is imported inside the functions that use it (the runner's entry point must start without
torch, to report its absence).
"""

from __future__ import annotations

import math
import random
import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..autoregions import inductor_regions
from ..bench import copy_bandwidth, do_bench_interleaved, median_ms
from ..harness import Check, Fp64Reference, retake_tainted, clone_all, clone_output, flat, judge, make_inputs, mean_half, native_threads, noise_floor, paired_round, thread_check

#: Timed candidate calls per round whose outputs are kept and compared with the reference.
TIMED_SAMPLES = 2

#: Timed calls of each side per round at least (100 ms of calls is one each at 15 ms per call).
ROUND_MIN_CALLS = 10


class Rotation:
    """Input sets used in turn by the timed calls, each set's version counters bumped (an
    in-place no-op outside the timed interval) before it is used again: a candidate that caches
    its last result by pointer, version or content fingerprint of its inputs has to do the work."""

    def __init__(self, sets: List[List[Any]]) -> None:
        self.sets, self.i = sets, 0

    def before(self) -> None:
        import torch

        self.i = (self.i + 1) % len(self.sets)
        for x in self.sets[self.i]:
            if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.dtype in (torch.int32, torch.int64)):
                x.add_(0)

    def current(self) -> List[Any]:
        return self.sets[self.i]


class TimedSample:
    """A uniform random sample of ``k`` of the candidate's timed calls (reservoir sampling): each
    kept call's input set index and a copy of its output. The timed call only counts and keeps a
    reference to the output; the copy is made in ``settle``, called before the next call (outside
    the timed interval) and once after the round."""

    def __init__(self, k: int = TIMED_SAMPLES, rng: Optional[random.Random] = None) -> None:
        self.k = k
        self.rng = rng if rng is not None else random.Random()
        self.calls = 0
        self.kept: List[Tuple[int, Any]] = []
        self._last: Optional[Tuple[int, Any]] = None

    def call(self, cand: Any, rot: Rotation) -> Any:
        """The timed call: the candidate on the rotation's current set; it only counts and keeps a
        reference (the reservoir draw is made in ``settle``, outside the timed interval)."""
        i = rot.i
        out = cand(*rot.current())
        self.calls += 1
        self._last = (i, out)
        return out

    def settle(self) -> None:
        if self._last is None:
            return
        i, out = self._last
        self._last = None
        if len(self.kept) < self.k:
            slot = len(self.kept)
        elif self.rng.random() < self.k / self.calls:
            slot = self.rng.randrange(self.k)
        else:
            return
        entry = (i, clone_output(out))
        if slot == len(self.kept):
            self.kept.append(entry)
        else:
            self.kept[slot] = entry

    def validate(self, refs: List[Any], policy: Dict[str, Any], fp64: Fp64Reference, sets: List[List[Any]]) -> Dict[str, Any]:
        """Each kept output against the reference's output for its input set (``judge``: the
        dtype's tolerance, else the fp64 rule on that set)."""
        results = [dict(judge(out, refs[i], policy, fp64, inputs_of(sets, i)), input_set=i) for i, out in self.kept]
        bad = [r for r in results if not r["ok"]]
        return {"ok": bool(results) and not bad, "calls": self.calls, "sampled": len(results),
                "failed": len(bad), "why": bad[0].get("why", "") if bad else ("" if results else "no timed call was sampled")}


def inputs_of(sets: List[List[Any]], i: int) -> Callable[[], List[Any]]:
    """Input set ``i`` on demand (the fp64 rule's inputs)."""
    return lambda: sets[i]


def _round_ms(base: Any, cand: Any, sets: List[List[Any]], name: str,
              sample: Optional[TimedSample] = None, regions: Optional[List[Any]] = None) -> "tuple[float, float, float]":
    """One round: baseline, candidate and baseline again timed call by call in turn in one
    region (``do_bench_interleaved``; the input sets rotated before every call): the baseline's
    median, and the other two on its scale by their paired ratios to it (``paired_round``: call i
    with call i, so a host phase within the round falls on both sides).
    With ``sample``, the candidate's timed calls are sampled (``TimedSample``); with
    ``regions``, the region is appended to it once exited."""
    rot = Rotation(sets)

    def before() -> None:
        if sample is not None:
            sample.settle()
        rot.before()

    timed = (lambda: sample.call(cand, rot)) if sample is not None else (lambda: cand(*rot.current()))
    a, b, c = do_bench_interleaved([lambda: base(*rot.current()), timed, lambda: base(*rot.current())],
                                   name=name, before_each=before, min_calls=ROUND_MIN_CALLS, regions=regions)
    if sample is not None:
        sample.settle()
    tb, tc, tb2 = paired_round([a, b, c])
    return tb, tc, tb2


def timed_outputs_round(ref_model: Any, base: Any, cand: Any, sets: List[List[Any]], name: str, policy: Dict[str, Any],
                        rng: Optional[random.Random] = None,
                        regions: Optional[List[Any]] = None) -> Tuple[Tuple[float, float, float], Dict[str, Any]]:
    """One timed round (``_round_ms``) with its candidate calls sampled, and the sample validated
    against the reference's outputs for the sets (computed before the round, on copies); its
    region appended to ``regions``."""
    import torch

    with torch.no_grad():
        refs = [clone_output(ref_model(*clone_all(xs))) for xs in sets]
    sample = TimedSample(rng=rng)
    times = _round_ms(base, cand, sets, name, sample, regions)
    return times, sample.validate(refs, policy, Fp64Reference(ref_model), sets)


def revalidate_after_timing(ck: Check, problem: Any, ref_model: Any, cand: Any, policy: Dict[str, Any], dev: Any,
                            per_round: List[Dict[str, Any]]) -> None:
    """``exploits:revalidation-timed`` from the rounds' samples, then one more validation on fresh
    inputs (``exploits:revalidation-after-timing``)."""
    import torch

    bad = [r for r in per_round if not r["ok"]]
    ck.add("exploits", "revalidation-timed", not bad, rounds=per_round, samples_per_round=TIMED_SAMPLES,
           why=f"round {bad[0].get('round', per_round.index(bad[0]))}: {bad[0]['why']}" if bad else "")
    ck.begin("exploits", "revalidation-after-timing")
    xs = make_inputs(problem, 499, "normal", dev)
    with torch.no_grad():
        ref = ref_model(*clone_all(xs))
        try:
            out: Any = clone_output(cand(*clone_all(xs)))
        except Exception as e:
            out = e
    r = judge(out, ref, policy, Fp64Reference(ref_model), lambda: make_inputs(problem, 499, "normal", dev))
    ck.add("exploits", "revalidation-after-timing", r["ok"], **r)


def _bytes(xs: Any) -> int:
    return sum(t.numel() * t.element_size() for t in flat(xs))


#: Input bytes up to which the timed calls rotate over three input sets (above: two).
ROTATION_BYTES = 1 << 30

#: A candidate must not beat a measured device peak by more than this factor (the peaks are
#: practical ones — a large copy, a large matmul — not the datasheet's).
PEAK_MARGIN = 1.15


def analytic_flops(model: Any, xs: Any) -> int:
    """FLOPs the reference computes (matmuls, convolutions, attention), counted analytically by
    torch's FlopCounterMode on the reference model. This is the work a candidate is assumed to
    do; a problem with a legitimate algebraic shortcut (``diag(a) @ B`` is a row scaling) says
    so in its policy (``flops = 0``, or the shortcut's count), else the shortcut is rejected."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model(*xs)
    return int(fc.get_total_flops())


def matmul_rate(dev: Any, dtype: Any) -> float:
    """FLOP/s of a 4096^3 matmul in ``dtype``; for fp32 the faster of IEEE and TF32 (a Triton
    ``tl.dot`` uses TF32 by default, and the precision gate, not this one, polices that)."""
    import torch

    n = 4096
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    rates = []
    settings = [False, True] if dtype == torch.float32 else [torch.backends.cuda.matmul.allow_tf32]
    saved = torch.backends.cuda.matmul.allow_tf32
    try:
        for tf32 in settings:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            ms = median_ms(lambda: a @ b, "verify:matmul-peak", warmup=10, rep=50)
            rates.append(2 * n**3 / (ms / 1e3))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return max(rates)


def compiled_calls_while_tracing_run_eagerly() -> bool:
    """While the baseline compiles in its thread, FX traces, and torch 2.11's "FX is tracing"
    flag is process-wide: a candidate whose forward calls ``torch.compile``, called by the checks
    meanwhile, raised "using FX to symbolically trace a dynamo-optimized function" (the H200: a
    config result rejected by correctness:seed-1-normal). Such a call runs the forward eagerly
    instead, as it does under the dispatch record anyway; gate 4 times the compiled one. Returns
    the setting before, which ``BaselineCompile.wait`` puts back (a warm worker runs commands
    after this one)."""
    import torch._dynamo

    before = bool(torch._dynamo.config.error_on_nested_fx_trace)
    torch._dynamo.config.error_on_nested_fx_trace = False
    return before


class BaselineCompile:
    """The baseline (``torch.compile`` of the reference) compiled in a thread of its own while
    the correctness and exploit checks run, so that gate 4 does not wait for Inductor. The
    thread compiles by one call on inputs made beforehand by the caller (making inputs seeds
    torch's global generator, which only the main thread touches). ``prime_torch_compile`` ran
    before the identity snapshots, so what a compile patches process-wide is not taken for the
    candidate's doing. ``wait`` joins the thread (before the thread checks count threads) and
    gives the compiled baseline; if the compile raised there, gate 4 compiles again itself."""

    def __init__(self, ref_model: Any, mode: str, xs: List[Any]) -> None:
        import torch

        self.mode = mode
        inductor_regions()  # under a daemon, max-autotune's own benchmarks run in regions
        self._nested_fx_error = compiled_calls_while_tracing_run_eagerly()
        self.base = torch.compile(ref_model, mode=mode)
        self.error: Optional[BaseException] = None
        self.seconds = 0.0
        self._xs: Optional[List[Any]] = xs
        self._thread = threading.Thread(target=self._compile, name="kforge-baseline-compile", daemon=True)
        self._thread.start()

    def _compile(self) -> None:
        import torch

        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                self.base(*(self._xs or []))  # type: ignore[no-untyped-call]
            torch.cuda.synchronize()
        except BaseException as e:  # a failed compile is redone in gate 4, on the main thread
            self.error = e
        self._xs = None
        self.seconds = time.perf_counter() - t0

    def wait(self) -> Any:
        import torch._dynamo

        self._thread.join()
        torch._dynamo.config.error_on_nested_fx_trace = self._nested_fx_error
        return self.base


def performance_gate(ck: Check, problem: Any, ref_model: Any, cand: Any, policy: Dict[str, Any], dev: Any,
                     compiled: Optional[BaselineCompile] = None) -> Dict[str, float]:
    """Gate 4; returns the seconds of its phases: the baseline's compile (its first call, or the
    wait for ``compiled``), the timed rounds, the re-validation after timing, the device peaks
    for plausibility."""
    import torch

    t = [time.perf_counter()]
    mode = str(policy.get("baseline_mode", "default"))
    inductor_regions()
    base = compiled.wait() if compiled is not None and compiled.error is None else torch.compile(ref_model, mode=mode)
    rounds = max(2, int(policy.get("rounds", 5)))
    speed: List[float] = []
    noise: List[float] = []
    tc_all: List[float] = []
    per_round: List[Dict[str, float]] = []
    sampled: List[Dict[str, Any]] = []
    threads: Any = None
    native: Any = None
    taint: Dict[str, int] = {"retaken": 0, "kept": 0}
    r = 0
    with torch.no_grad():
        while r < rounds:
            sets = [make_inputs(problem, 400 + 3 * r, "normal", dev)]
            # Three input sets rotate; at GB sizes two (each set and its reference output cost
            # their size again; a cache keyed on pointers was already caught by the exploit checks).
            sets += [make_inputs(problem, 400 + 3 * r + k, "normal", dev) for k in range(1, 3 if _bytes(sets[0]) <= ROTATION_BYTES else 2)]
            xs = sets[0]
            base(*xs)  # type: ignore[no-untyped-call]
            if len(t) == 1:  # the first round (not a retaken one)
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                t.append(time.perf_counter())  # the baseline compiled
            cand(*xs)
            if threads is None:  # after the baseline's compile: from here on only timing runs
                threads, native = set(threading.enumerate()), native_threads()
            held: List[Any] = []
            (tb, tc, tb2), check = timed_outputs_round(ref_model, base, cand, sets, f"verify:round-{r}", policy, regions=held)
            sampled.append(dict(check, round=r))  # a retaken round's sample is validated all the same
            if retake_tainted(held, taint) == "retaken":  # not exclusive: timed again, a bounded number of times
                continue
            r += 1
            speed.append(math.log(tb / tc))
            noise.append(math.log(tb2 / tb))
            tc_all.append(tc)
            per_round.append({"baseline_ms": tb, "candidate_ms": tc, "baseline_again_ms": tb2})
        out = cand(*xs)
    # A thread the candidate starts only while it is timed.
        del sets
    t.append(time.perf_counter())  # the rounds timed
    thread_check(ck, "thread-count-timed", threads, False, gate="performance", native_before=native)
    revalidate_after_timing(ck, problem, ref_model, cand, policy, dev, sampled)
    t.append(time.perf_counter())
    mean, half = mean_half(speed)
    floor = noise_floor(noise)
    lo, hi = math.exp(mean - half), math.exp(mean + half)
    ck.add("performance", "speedup", mean - half > floor, baseline=f"torch.compile(mode={mode!r})", speedup=math.exp(mean),
           ci95=[lo, hi], noise_floor=math.exp(floor), largest_baseline_self_ratio=math.exp(max(abs(n) for n in noise)),
           rounds=rounds, per_round=per_round, tainted_rounds=taint)
    seconds = statistics.median(tc_all) / 1e3
    moved = _bytes(xs) + _bytes(out)
    achieved = moved / seconds
    peak = copy_bandwidth(dev)
    flops = int(policy["flops"]) if policy.get("flops") is not None else analytic_flops(ref_model, xs)
    floats = [t for t in flat(xs) if t.is_floating_point()]
    rate = flops / seconds if flops else 0.0
    rate_peak = matmul_rate(dev, floats[0].dtype) if flops and floats else float("inf")
    ok = achieved <= PEAK_MARGIN * peak and rate <= PEAK_MARGIN * rate_peak
    ck.add("performance", "plausibility", ok, bytes_at_least=moved, achieved_bytes_per_s=achieved, copy_peak_bytes_per_s=peak,
           analytic_flops=flops, achieved_flops_per_s=rate, matmul_peak_flops_per_s=rate_peak, margin=PEAK_MARGIN,
           note="" if ok else "faster than the device's measured copy or matmul peak allows: does less work")
    t.append(time.perf_counter())
    names = ("baseline-compile", "timing", "revalidation-after-timing", "plausibility")
    return {n: round(b - a, 3) for n, a, b in zip(names, t, t[1:])}
