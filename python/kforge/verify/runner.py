"""The candidate-side process of ``kforge verify`` (never imported by the orchestrator).

``python3 -m kforge.verify.runner PROBLEM CANDIDATE --out RESULT.json [--policy-json JSON]
[--device cpu|cuda] [--no-performance]``

Runs a KernelBench-style ``ModelNew`` candidate against the problem's ``Model`` and writes every
runtime check with its evidence: the dry run; gate 2 (several seeds x input distributions, NaN
sentinels planted where the candidate's outputs are likely to be allocated, the reference first on
its own clones, inputs checked unchanged); gate 3 (eager at 1e-4, else the fp64 rule); the exploit
checks (determinism, input perturbation in place, re-validation after repeated calls, thread
count, timer identity, ghost replay, kernels ran, side streams); and on a GPU gate 4 (interleaved
timing against the compiled baseline, noise floor, confidence interval, bandwidth plausibility).
The orchestrator (Rust) turns this into the verdict. Exit status: 0 result written, 2 could not run.
torch is imported inside the functions that use it: a missing torch is "could not run", said so.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import threading
from typing import Any, Optional, Sequence

from ..harness import finite_json
from .checks import RunnerError, library_identities, run_checks, timer_identities
from .kernel import KernelCandidate


def load_module(path: str, tag: str) -> Any:
    if not os.path.isfile(path):
        raise RunnerError(f"{path}: no such file")
    spec = importlib.util.spec_from_file_location(f"kforge_verify_{tag}", path)
    if spec is None or spec.loader is None:
        raise RunnerError(f"{path}: not a Python file")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
    except Exception as e:
        raise RunnerError(f"{path}: importing it failed: {type(e).__name__}: {e}") from e
    return mod


def prime_torch_compile(dev: Any) -> None:
    """Run torch.compile once on a throwaway function. What it starts and patches process-wide
    (Inductor's compile-worker threads; Dynamo wraps ``torch.manual_seed``) then belongs to the
    baseline the exploit checks compare against — a replacement kernel is verified inside a
    compiled problem, so the harness compiles after that baseline."""
    import torch

    f = torch.compile(lambda x: x * 2.0 + 1.0, dynamic=False)
    f(torch.ones(64, device=dev))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    torch._dynamo.reset()


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kforge.verify.runner")
    ap.add_argument("problem")
    ap.add_argument("candidate")
    ap.add_argument("--out", required=True)
    ap.add_argument("--policy-json", default="{}")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--no-performance", action="store_true")
    ap.add_argument("--kernel", help="CANDIDATE is a replacement source for this Inductor kernel of PROBLEM")
    a = ap.parse_args(argv)
    try:
        try:
            import torch
        except ImportError as e:
            raise RunnerError(f"torch is not importable here ({e})") from e
        dev_s = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        if dev_s.startswith("cuda") and not torch.cuda.is_available():
            raise RunnerError("--device cuda but no CUDA GPU is visible")
        policy = json.loads(a.policy_json)
        problem = load_module(a.problem, "problem")
        for fn in ("Model", "get_inputs", "get_init_inputs"):
            if getattr(problem, fn, None) is None:
                raise RunnerError(f"{a.problem}: no {fn} (a KernelBench problem needs class Model, get_inputs(), get_init_inputs())")
        if a.kernel:
            if not dev_s.startswith("cuda"):
                raise RunnerError("a replacement kernel is verified inside the torch.compile'd problem, which needs a CUDA GPU")
            prime_torch_compile(torch.device(dev_s))
        timers0, threads0 = timer_identities(), set(threading.enumerate())
        libs0 = library_identities(problem)
        cand: Any
        if a.kernel:
            with open(a.candidate) as f:
                cand = KernelCandidate(problem, a.kernel, f.read(), str(policy.get("baseline_mode", "default")), torch.device(dev_s), policy)
        else:
            cand = load_module(a.candidate, "candidate")
            if getattr(cand, "ModelNew", None) is None:
                raise RunnerError(f"{a.candidate}: no class ModelNew")
        res = run_checks(problem, cand, policy, torch.device(dev_s), not a.no_performance, timers0, threads0, libs0)
        res["device"] = dev_s
    except RunnerError as e:
        print(f"kforge verify: {e}", file=sys.stderr)
        return 2
    with open(a.out, "w") as f:
        json.dump(finite_json(res), f, default=str, allow_nan=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
