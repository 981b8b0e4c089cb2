"""Gate 4 of ``kforge verify`` (GPU only): interleaved timing against the compiled baseline.

Per round, fresh inputs; baseline, candidate and baseline again are timed with
``kforge.do_bench`` (L2 flushed per call; inside kforge regions when run as a kforge job). The
speedup is the geometric mean of baseline/candidate over rounds with a 95 % confidence interval
(t over log ratios); the noise floor is the largest |log| of baseline-again/baseline. Accepted only
when the interval's lower end is beyond the noise floor. Plausibility: the bytes the candidate
must at least move (its inputs and outputs) over its time must not exceed the device's measured
copy bandwidth — faster than that is "does less work".
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List

from .bench import do_bench
from .verify_runner import Check, _flat, make_inputs

# Two-sided 95 % t quantiles by degrees of freedom (1..10; beyond: 1.96 is close enough).
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]


def _ms(fn: Any, name: str, **kw: Any) -> float:
    v = do_bench(fn, return_mode="median", name=name, **kw)
    assert isinstance(v, float)
    return v


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


def _ms_rotating(call: Any, sets: List[List[Any]], name: str) -> float:
    rot = Rotation(sets)
    v = do_bench(lambda: call(*rot.current()), return_mode="median", name=name, before_each=rot.before)
    assert isinstance(v, float)
    return v


def _bytes(xs: Any) -> int:
    return sum(t.numel() * t.element_size() for t in _flat(xs))


def copy_bandwidth(dev: Any) -> float:
    """Bytes per second of a 1 GiB device-to-device copy (read + write)."""
    import torch

    n = 1 << 28
    src = torch.empty(n, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    ms = _ms(lambda: dst.copy_(src), "verify:copy-bandwidth", warmup=10, rep=50)
    return 2 * n * 4 / (ms / 1e3)


def performance_gate(ck: Check, problem: Any, ref_model: Any, cand: Any, policy: Dict[str, Any], dev: Any) -> None:
    import torch

    mode = str(policy.get("baseline_mode", "default"))
    base = torch.compile(ref_model, mode=mode)
    rounds = max(2, int(policy.get("rounds", 5)))
    speed: List[float] = []
    noise: List[float] = []
    tc_all: List[float] = []
    with torch.no_grad():
        for r in range(rounds):
            sets = [make_inputs(problem, 400 + 3 * r + k, "normal", dev) for k in range(3)]
            xs = sets[0]
            base(*xs)
            cand(*xs)
            tb = _ms_rotating(base, sets, "verify:baseline")
            tc = _ms_rotating(cand, sets, "verify:candidate")
            tb2 = _ms_rotating(base, sets, "verify:baseline-again")
            speed.append(math.log(tb / tc))
            noise.append(abs(math.log(tb2 / tb)))
            tc_all.append(tc)
        out = cand(*xs)
    mean = statistics.fmean(speed)
    sd = statistics.stdev(speed) if len(speed) > 1 else 0.0
    half = _T95[min(len(speed) - 2, len(_T95) - 1)] * sd / math.sqrt(len(speed))
    floor = max(noise)
    lo, hi = math.exp(mean - half), math.exp(mean + half)
    ck.add("performance", "speedup", mean - half > floor, baseline=f"torch.compile(mode={mode!r})", speedup=math.exp(mean),
           ci95=[lo, hi], noise_floor=math.exp(floor), rounds=rounds)
    moved = _bytes(xs) + _bytes(out)
    achieved = moved / (statistics.median(tc_all) / 1e3)
    peak = copy_bandwidth(dev)
    ck.add("performance", "plausibility", achieved <= peak, bytes_at_least=moved, achieved_bytes_per_s=achieved,
           copy_peak_bytes_per_s=peak, note="faster than copying its inputs and outputs is impossible: does less work" if achieved > peak else "")
