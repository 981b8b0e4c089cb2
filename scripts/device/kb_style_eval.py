"""A KernelBench-style eval that knows nothing of kforge (the subject of `auto_regions.sh`).

Usage: python3 kb_style_eval.py LABEL OUT.json

Two problems in KernelBench's shape (a ``Model`` and ``get_inputs``): a bf16 4096^3 matmul and an
elementwise swish over 64 M fp32 (256 MB). Each is checked once against fp32 and then timed three
ways, as user scripts do:

* ``do_bench``: ``triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="all")``, 3 calls;
* ``events``: KernelBench's ``time_execution_with_cuda_event``: per trial a fresh event pair
  around one call, ``torch.cuda.synchronize()``, ``elapsed_time`` (100 trials);
* ``event-loop``: one event pair around 10 calls, ``torch.cuda.synchronize()``, per-call mean
  (30 loops);
* ``timer``: ``torch.utils.benchmark.Timer(...).blocked_autorange(min_run_time=0.2)``, its
  per-block means.

Writes ``{label, device, torch, triton, problems: {NAME: {METHOD: [ms, ...]}}}`` to OUT.json and
prints p50/p95 per series, and a progress line (``LABEL NAME METHOD start +SECONDS``, flushed)
before each series and the check, so a run killed at its time limit shows where it was. Imports no kforge module: under ``kforge run --auto-regions`` its timed
calls get regions without edits.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F
import torch.utils.benchmark
import triton
import triton.testing


class MatmulModel(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


class SwishModel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


def matmul_inputs() -> List[torch.Tensor]:
    return [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) for _ in range(2)]


def swish_inputs() -> List[torch.Tensor]:
    return [torch.randn(64 * 1024 * 1024, device="cuda", dtype=torch.float32)]


def check(model: torch.nn.Module, inputs: List[torch.Tensor]) -> float:
    got = model(*inputs).float()
    ref = model(*[t.float() for t in inputs])
    return float(((got - ref).norm() / ref.norm()).item())


def time_do_bench(fn: Callable[[], object]) -> List[float]:
    out: List[float] = []
    for _ in range(3):
        try:
            r = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="all")
        except TypeError:  # an older Triton without return_mode="all"
            r = [triton.testing.do_bench(fn, warmup=25, rep=100)]
        out += [float(x) for x in (r if isinstance(r, list) else [r])]
    return out


def time_events(fn: Callable[[], object], trials: int = 100) -> List[float]:
    # As KernelBench's time_execution_with_cuda_event: warm-up, then one event pair per trial.
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times: List[float] = []
    for _ in range(trials):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return times


def time_event_loop(fn: Callable[[], object], loops: int = 30, calls: int = 10) -> List[float]:
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    times: List[float] = []
    for _ in range(loops):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return times


def time_timer(fn: Callable[[], object]) -> List[float]:
    m = torch.utils.benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.2)
    return [t * 1e3 for t in m.times]


def quantile(xs: List[float], p: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * p
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def main() -> None:
    label, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    t0 = time.time()
    res: Dict[str, object] = {"label": label, "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                              "triton": triton.__version__}
    problems: Dict[str, Dict[str, List[float]]] = {}
    def progress(name: str, step: str) -> None:
        print(f"{label} {name} {step} start +{time.time() - t0:.2f}", flush=True)

    for name, model, inputs in (("matmul_bf16_4096", MatmulModel(), matmul_inputs()),
                                ("swish_fp32_64M", SwishModel(), swish_inputs())):
        progress(name, "check")
        rel = check(model, inputs)
        assert rel < 2e-2, f"{name}: relative error {rel}"

        def fn(model: torch.nn.Module = model, inputs: List[torch.Tensor] = inputs) -> object:
            return model(*inputs)

        methods: Dict[str, Callable[[Callable[[], object]], List[float]]] = {
            "do_bench": time_do_bench, "events": time_events, "event-loop": time_event_loop, "timer": time_timer}
        series: Dict[str, List[float]] = {}
        for method, timing in methods.items():
            progress(name, method)
            series[method] = timing(fn)
        problems[name] = series
        for method, xs in series.items():
            print(f"{label:<12} {name:<18} {method:<10} p50 {quantile(xs, 0.5):.4f} ms  p95 {quantile(xs, 0.95):.4f} ms"
                  f"  n={len(xs)}", flush=True)
        del inputs
        torch.cuda.empty_cache()
    res["problems"] = problems
    res["wall_s"] = round(time.time() - t0, 2)
    with open(out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
