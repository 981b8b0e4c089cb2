#!/usr/bin/env python3
"""Which of Inductor's autotuning benchmarks ``kforge.autoregions.launches_its_kernel_alone``
recognises on this torch: a max-autotune compile of a small GEMM and a convolution, with every
``benchmark_gpu`` call's callable classified (no daemon; Inductor's own timings unchanged).

    python3 scripts/device/slow_choice_probe.py OUT.json

Run it with a fresh ``TORCHINDUCTOR_CACHE_DIR`` (a warm cache autotunes nothing). Prints a table
last: per kind of callable, how many calls, how many were recognised as launching their kernel
alone (the one-call rule of ``INDUCTOR_SLOW_CALL_S``), how many kforge's hooks would compile
before the benchmark (``compile_choice``) and how many are recognised after that
(``alone_after``) with, for those, the most a first call took beyond Inductor's own timing of
the kernel (``one_time_ms_max``: the one-call rule is safe while that stays far below
``INDUCTOR_SLOW_CALL_S``), and, for an Inductor autotuner's ``run``, its launchers, coordinate descent
flag, combo tuning and heuristic type.
"""
from __future__ import annotations

import collections
import functools
import json
import os
import sys
import time
from typing import Any, Dict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402
import torch._inductor.runtime.benchmarking as benchmarking  # noqa: E402

from kforge.autoregions import compile_choice, launches_its_kernel_alone  # noqa: E402

SEEN: Dict[str, Dict[str, int]] = collections.defaultdict(lambda: {"calls": 0, "alone": 0})


def kind_of(fn: Any) -> str:
    f = fn
    while isinstance(f, functools.partial):
        f = f.func
    func = getattr(f, "__func__", f)
    return f"{type(getattr(f, '__self__', None)).__name__}.{getattr(func, '__qualname__', type(f).__name__)}"


def wrap(cls: Any) -> None:
    inner = vars(cls).get("benchmark_gpu")
    if inner is None:
        return

    @functools.wraps(inner)
    def benchmark_gpu(self: Any, _callable: Any, *args: Any, **kwargs: Any) -> Any:
        row = SEEN[kind_of(_callable)]
        row["calls"] += 1
        row["alone"] += bool(launches_its_kernel_alone(_callable))
        row["compiled_here"] = row.get("compiled_here", 0) + bool(compile_choice(_callable))  # as kforge's hooks do
        alone = launches_its_kernel_alone(_callable)
        row["alone_after"] = row.get("alone_after", 0) + bool(alone)
        first_ms = None
        if alone:  # what the one-call rule would take: the first call, from a device wait to a device wait
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            _callable()
            torch.cuda.synchronize()
            first_ms = (time.perf_counter() - t0) * 1e3
        f = _callable
        while isinstance(f, functools.partial):
            f = f.func
        o = getattr(f, "__self__", None)
        if o is not None and hasattr(o, "launchers"):
            meta = getattr(o, "inductor_meta", {}) or {}
            why = f"launchers={len(o.launchers)} cdt={meta.get('coordinate_descent_tuning')} combo={bool(meta.get('combo_tuning_groups'))} kind={getattr(getattr(o, 'heuristic_type', None), 'name', None)} qual={getattr(getattr(f, '__func__', None), '__qualname__', None)}"
            row[why] = row.get(why, 0) + 1
        result = inner(self, _callable, *args, **kwargs)
        if first_ms is not None:  # the first call's cost beyond Inductor's own timing (one-time costs)
            ms = min(result) if isinstance(result, list) else float(result)
            row["one_time_ms_max"] = round(max(row.get("one_time_ms_max", 0.0), first_ms - ms), 3)
        return result

    setattr(cls, "benchmark_gpu", benchmark_gpu)


def main() -> int:
    out = sys.argv[1]
    for cls in list(vars(benchmarking).values()):
        if isinstance(cls, type) and cls.__module__ == benchmarking.__name__:
            wrap(cls)
    dev = torch.device("cuda")
    a, b = torch.randn(2048, 2048, device=dev), torch.randn(2048, 2048, device=dev)
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).to(dev)
    x = torch.randn(16, 64, 56, 56, device=dev)
    t0 = time.perf_counter()
    torch.compile(lambda p, q: torch.relu(p @ q), mode="max-autotune-no-cudagraphs")(a, b)
    torch.compile(lambda y: torch.relu(conv(y)), mode="max-autotune-no-cudagraphs")(x)
    torch.cuda.synchronize()
    result = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "compile_s": round(time.perf_counter() - t0, 1),
              "callables": dict(SEEN)}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{'CALLABLE':<60} {'CALLS':>6} {'ALONE':>6}")
    for k, v in sorted(SEEN.items()):
        rest = {w: n for w, n in v.items() if w not in ("calls", "alone")}
        print(f"{k[:60]:<60} {v['calls']:>6} {v['alone']:>6} {rest}")
    print(f"torch {torch.__version__} on {result['gpu']}, compiles {result['compile_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
