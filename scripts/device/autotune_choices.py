"""One ``torch.compile(mode="max-autotune")`` of a suite problem, recording the choices its
autotuning made; the job of ``scripts/device/autotune_regions.sh`` (run as a daemon job, with or
without ``--auto-regions``).

    python3 autotune_choices.py PROBLEM OUT.json [--size default] [--device cuda] [--step]

Recorded in OUT.json (``choices`` is what the agreement table compares):

* ``select``: per ``select_algorithm`` call (max-autotune's template/extern-kernel choice, via
  ``torch._inductor.select_algorithm.add_feedback_saver``): the op name, its input layouts, the
  winning choice, the three fastest with their times and the winner's margin over the second;
* ``configs``: per Triton kernel autotuned by the heuristics (``CachingAutotuner.
  benchmark_all_configs``, pointwise/reduction/template configs): the winning config, the three
  fastest and the margin; ``coordesc``: a config coordinate descent settled on, per kernel;
* ``best_config``: the ``*.best_config`` files of the compile's own cache directory (Inductor's
  autotune cache; ``TORCHINDUCTOR_CACHE_DIR`` must be fresh per compile: the script sets it);
* ``benchmarks``: Inductor's benchmarking counters (calls per benchmarker method);
* ``ms``: the compiled problem's time by ``kforge.do_bench`` (a region), ``compile_s``.

``--step``: call ``kforge.autoregions.inductor_regions()`` before compiling (the hooks a kforge
step that compiles installs itself, without ``--auto-regions``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import time
from typing import Any, Dict, List, Tuple

import torch

import kforge
from kforge.autoregions import inductor_regions
from kforge.harness import load_problem, make_inputs

TIMING_KEYS = ("time_taken_ms", "triton_cache_hash")


def choice_key(c: Any) -> str:
    """A choice by what it is, not by its position: the kernel name without the running index
    plus the description (a template's tile configuration)."""
    name = re.sub(r"_\d+$", "", str(getattr(c, "name", type(c).__name__)))
    desc = str(getattr(c, "description", "") or "")
    return f"{type(c).__name__}:{name}" + (f" [{desc}]" if desc else "")


def ranked(timings: Dict[Any, float], key: Any) -> Tuple[str, List[Tuple[str, float]], float]:
    """(winner, the three fastest, the second's time over the winner's minus one)."""
    rows = sorted(((key(c), float(ms)) for c, ms in timings.items()), key=lambda r: r[1])
    rows = [(k, ms) for k, ms in rows if ms == ms]  # drop NaN
    if not rows:
        return "", [], 0.0
    margin = rows[1][1] / rows[0][1] - 1.0 if len(rows) > 1 and rows[0][1] > 0 else float("inf")
    return rows[0][0], rows[:3], margin


def layouts(nodes: List[Any]) -> str:
    out = []
    for n in nodes:
        try:
            out.append(f"{n.get_dtype()}{list(n.get_size())}/{list(n.get_stride())}")
        except Exception:  # a node without a layout (a symbolic one): its type
            out.append(type(n).__name__)
    return ",".join(out)


def record_select(rec: Dict[str, Any]) -> None:
    from torch._inductor import select_algorithm

    def saver(timings: Dict[Any, float], name: str, input_nodes: List[Any], *rest: Any) -> None:
        winner, top, margin = ranked(timings, choice_key)
        rec["select"].append({"op": name, "inputs": layouts(list(input_nodes)), "winner": winner,
                              "top": top, "margin": margin, "n": len(timings)})

    select_algorithm.add_feedback_saver(saver)


def record_configs(rec: Dict[str, Any]) -> None:
    from torch._inductor.runtime import triton_heuristics as th

    cls = th.CachingAutotuner
    bench_all = cls.benchmark_all_configs
    coordesc = getattr(cls, "coordinate_descent_tuning", None)

    def kernel(self: Any) -> str:
        return str(getattr(getattr(self, "fn", None), "__name__", None) or self.inductor_meta.get("kernel_name", "?"))

    def benchmark_all_configs(self: Any, *args: Any, **kwargs: Any) -> Any:
        timings = bench_all(self, *args, **kwargs)
        winner, top, margin = ranked(timings, lambda launcher: str(launcher.config))
        rec["configs"].append({"kernel": kernel(self), "winner": winner, "top": top, "margin": margin,
                               "n": len(timings)})
        return timings

    cls.benchmark_all_configs = benchmark_all_configs
    if coordesc is not None:
        def coordinate_descent_tuning(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> Any:
            best = coordesc(self, launcher, *args, **kwargs)
            rec["coordesc"].append({"kernel": kernel(self), "config": str(getattr(best, "config", best))})
            return best

        cls.coordinate_descent_tuning = coordinate_descent_tuning


def best_configs(cache_dir: str) -> Dict[str, Any]:
    out = {}
    for path in sorted(glob.glob(os.path.join(cache_dir, "**", "*.best_config"), recursive=True)):
        try:
            with open(path) as f:
                cfg = json.load(f)
        except (OSError, ValueError):
            continue
        out[os.path.basename(path)] = {k: v for k, v in cfg.items() if k not in TIMING_KEYS}
    return out


def choices(rec: Dict[str, Any]) -> Dict[str, str]:
    """What the agreement compares: per op/kernel (numbered in call order where a name repeats)
    the winner."""
    out: Dict[str, str] = {}
    for kind, items, name in (("select", rec["select"], lambda r: f"{r['op']}({r['inputs']})"),
                              ("config", rec["configs"], lambda r: r["kernel"]),
                              ("coordesc", rec["coordesc"], lambda r: r["kernel"])):
        for r in items:
            k = f"{kind}:{name(r)}"
            i = 1
            while (f"{k}#{i}" if i > 1 else k) in out:
                i += 1
            out[f"{k}#{i}" if i > 1 else k] = r.get("winner", r.get("config", ""))
    for fname, cfg in rec["best_config"].items():
        out[f"best_config:{fname}"] = json.dumps(cfg, sort_keys=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("problem")
    ap.add_argument("out")
    ap.add_argument("--size", default="default")
    ap.add_argument("--device", default="cuda", help="cuda (the experiment) or cpu (the tests)")
    ap.add_argument("--step", action="store_true", help="kforge.autoregions.inductor_regions() before compiling")
    a = ap.parse_args()
    cache_dir = os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
    if not cache_dir:
        print("autotune_choices: set TORCHINDUCTOR_CACHE_DIR to a fresh directory per compile", file=sys.stderr)
        return 2
    rec: Dict[str, Any] = {"problem": a.problem, "select": [], "configs": [], "coordesc": [], "pid": os.getpid(),
                           "job": os.environ.get("KFORGE_JOB"), "auto_regions": os.environ.get("KFORGE_AUTO_REGIONS") == "1",
                           "step": a.step, "torch": torch.__version__,
                           "subproc": os.environ.get("TORCHINDUCTOR_AUTOTUNE_IN_SUBPROC") == "1"}
    if a.step:
        rec["step_hooks"] = type(inductor_regions()).__name__
    dev = torch.device(a.device)
    problem = load_problem(a.problem, a.size, "autotune")
    torch.manual_seed(0)
    with torch.device(dev):
        model = problem.Model(*problem.get_init_inputs()).eval()
    xs = make_inputs(problem, 0, "normal", dev)
    record_select(rec)
    record_configs(rec)
    t0 = time.perf_counter()
    compiled = torch.compile(model, mode="max-autotune", dynamic=False)
    with torch.no_grad():
        compiled(*xs)
        if dev.type == "cuda":
            torch.cuda.synchronize()
    rec["compile_s"] = time.perf_counter() - t0
    with torch.no_grad():
        rec["ms"] = float(kforge.do_bench(lambda: compiled(*xs), return_mode="median", name="autotune:compiled",
                                        device=str(dev)))  # type: ignore[arg-type]
    from torch._dynamo.utils import counters

    rec["benchmarks"] = {k: v for k, v in counters["inductor"].items() if k.startswith("benchmarking.")}
    rec["best_config"] = best_configs(cache_dir)
    rec["choices"] = choices(rec)
    with open(a.out, "w") as f:
        json.dump(rec, f, indent=1, default=str)
    print(f"{a.problem}: {len(rec['select'])} select, {len(rec['configs'])} config autotunes, "
          f"{len(rec['best_config'])} best_config files, compile {rec['compile_s']:.1f} s, {rec['ms']:.4f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
