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
The orchestrator (Rust) turns this into the verdict. Exit status: 0 result written, 2 could not run
(the environment or the problem, never the candidate: a line ``kforge verify: WHY`` and, where
there is one, ``kforge verify fix: WHAT TO DO``). Any other ending (a traceback, a signal, an
``os._exit``) the orchestrator classifies from the progress file (``--progress``: one JSON line
per check and per check about to run) and the traceback's frames.
torch is imported inside the functions that use it: a missing torch is "could not run", said so.
With ``--device cpu`` Triton kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, set
here before anything imports Triton, and by ``kforge verify`` in the process's environment).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import sys
import threading
import time
import traceback
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from ..harness import SIZES, Check, apply_size, finite_json, native_threads, record_thread_origins, strict_fp32
from .cascade import run_checks
from .checks import NO_DRIVER_FIX, RunnerError, library_identities, timer_identities
from .kernel import KernelCandidate


#: Modules of the environment: a candidate or problem that cannot import one of these did not
#: fail, the environment lacks it (could not run, with the install named).
ENVIRONMENT_MODULES = ("torch", "triton", "numpy")

#: What ``torch.utils.cpp_extension`` raises when a native (``load_inline``) candidate's build
#: tools are missing: the environment lacks them (could not run), with the fix. A compile error in
#: the candidate's own source stays its failure.
BUILD_TOOLS = (("Ninja is required to load C++ extensions", "pip install ninja"),
               ("CUDA_HOME environment variable is not set", "install the CUDA toolkit (nvcc) and set CUDA_HOME"))

#: Traceback lines kept as a failure's evidence.
TRACEBACK_LINES = 8


class CandidateImportError(Exception):
    """Importing the candidate raised: its own failure (a rejection by ``dry-run:import``)."""


def missing_environment_module(e: BaseException) -> Optional[str]:
    if isinstance(e, ModuleNotFoundError) and (e.name or "").split(".")[0] in ENVIRONMENT_MODULES:
        return (e.name or "").split(".")[0]
    return None


def load_module(path: str, tag: str) -> Any:
    """Import the file at ``path``. A missing torch, Triton or numpy is the environment's
    (``RunnerError``); anything else raised while the candidate imports is its own failure
    (``CandidateImportError``), while the problem imports bad input (``RunnerError``)."""
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
        missing = missing_environment_module(e)
        if missing is not None:
            raise RunnerError(f"{path}: needs {missing}, which is not importable here ({e})", f"pip install {missing}") from e
        for text, fix in BUILD_TOOLS:
            if text in str(e):
                raise RunnerError(f"{path}: a native extension cannot be built here ({type(e).__name__}: {e})", fix) from e
        if tag == "candidate":
            raise CandidateImportError(f"{type(e).__name__}: {e}") from e
        raise RunnerError(f"{path}: importing it failed: {type(e).__name__}: {e}", f"fix {path}") from e
    return mod


def traceback_tail(e: BaseException) -> "list[str]":
    """The last lines of ``e``'s traceback (the innermost frames and the exception)."""
    lines = "".join(traceback.format_exception(type(e), e, e.__traceback__)).rstrip().splitlines()
    return lines[-TRACEBACK_LINES:]


def rejected(ck: Check, gate: str, name: str, **evidence: Any) -> Dict[str, Any]:
    """A result rejected by ``gate``:``name`` before the runtime checks could start."""
    ck.add(gate, name, False, **evidence)
    return {"checks": ck.items}


def prime_torch_compile(dev: Any) -> None:
    """Run torch.compile once on a throwaway function. What it starts and patches process-wide
    (Inductor's compile-worker threads; Dynamo wraps ``torch.manual_seed``) then belongs to the
    baseline the exploit checks compare against — a replacement kernel is verified inside a
    compiled problem, so the harness compiles after that baseline."""
    import torch
    import torch._inductor.config as inductor_config

    # In this process, not in a pool of compile workers: starting the pool took seconds on the
    # H200 and a one-kernel compile needs none (the baseline, compiled later, gets the pool).
    threads = inductor_config.compile_threads
    inductor_config.compile_threads = 1
    try:
        f = torch.compile(lambda x: x * 2.0 + 1.0, dynamic=False)
        f(torch.ones(64, device=dev))
        if dev.type == "cuda":
            torch.cuda.synchronize()
    finally:
        inductor_config.compile_threads = threads
    torch._dynamo.reset()


class Laps:
    """Seconds between marks: ``mark(name)`` records the time since the previous mark."""

    def __init__(self, start: float) -> None:
        self.last = start
        self.seconds: Dict[str, float] = {}

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self.last, 3)
        self.last = now


def interpret_triton() -> None:
    """``--device cpu``: Triton's kernels run in its interpreter on CPU tensors, which it reads
    from ``TRITON_INTERPRET`` when it is imported; a warm worker that imported Triton already
    cannot give that."""
    if warm_isolation() is not None and "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RunnerError("the warm worker imported Triton before TRITON_INTERPRET=1 could be set: "
                          "on the cpu device its kernels would not run in the interpreter",
                          "start the daemon with --worker-preload torch (no triton) for cpu jobs, "
                          "or verify without --warm")
    os.environ["TRITON_INTERPRET"] = "1"


def torch_for(device: str, ck: Check, laps: Laps) -> Tuple[Any, str]:
    """torch imported (strict fp32 set before the problem and the candidate are) and the device
    the checks run on (``auto``: the GPU, which must be visible)."""
    ck.begin("setup", "import-torch")
    try:
        import torch
    except ImportError as e:
        raise RunnerError(f"torch is not importable here ({e})", "pip install torch") from e
    strict_fp32()
    laps.mark("setup.import-torch")
    ck.begin("setup", "device")
    if device == "auto" and not torch.cuda.is_available():
        raise RunnerError("--device auto and no CUDA GPU is visible", NO_DRIVER_FIX)
    dev_s = device if device != "auto" else "cuda"
    if dev_s.startswith("cuda") and not torch.cuda.is_available():
        raise RunnerError("--device cuda but no CUDA GPU is visible", NO_DRIVER_FIX)
    return torch, dev_s


def load_problem(path: str, size: str) -> Any:
    """The problem's module at its size preset, with the three names a KernelBench problem needs."""
    problem = load_module(path, "problem")
    try:
        apply_size(problem, size, path)
    except ValueError as e:
        raise RunnerError(str(e), f"add a LARGE dict to {path} (see problems/README.md)") from e
    for fn in ("Model", "get_inputs", "get_init_inputs"):
        if getattr(problem, fn, None) is None:
            raise RunnerError(f"{path}: no {fn} (a KernelBench problem needs class Model, get_inputs(), get_init_inputs())")
    return problem


def module_checks(path: str, ck: Check, checks: Callable[[Any], Dict[str, Any]]) -> Dict[str, Any]:
    """A candidate module's result: rejected by the dry run when importing it raises or it has no
    ``ModelNew``, else ``checks(module)``."""
    ck.begin("dry-run", "import")
    try:
        cand = load_module(path, "candidate")
    except CandidateImportError as e:
        cause = e.__cause__ if e.__cause__ is not None else e
        return rejected(ck, "dry-run", "import", error=f"importing {path} raised {e}", traceback=traceback_tail(cause))
    if getattr(cand, "ModelNew", None) is None:
        return rejected(ck, "dry-run", "interface", error=f"{path}: no class ModelNew")
    return checks(cand)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kforge.verify.runner")
    ap.add_argument("problem")
    ap.add_argument("candidate")
    ap.add_argument("--out", required=True)
    ap.add_argument("--policy-json", default="{}")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--no-performance", action="store_true")
    ap.add_argument("--size", default="default", choices=SIZES, help="the problem's size preset")
    ap.add_argument("--kernel", help="CANDIDATE is a replacement source for this Inductor kernel of PROBLEM")
    ap.add_argument("--progress", help="append one JSON line per check (and per check about to run) to this file")
    a = ap.parse_args(argv)
    began = time.perf_counter()
    laps = Laps(began)
    if warm_isolation() == "in-process":  # before anything here patches the worker's process
        print("kforge verify: a warm worker runs jobs in-process here: what a candidate changes in the process "
              "would reach the jobs after it, and the checks assume a process of its own", file=sys.stderr)
        print("kforge verify fix: start the daemon with --worker-fork (each job in a child of its own); "
              "under --warm-python every Python command is routed to the warm workers", file=sys.stderr)
        return 2
    record_thread_origins()
    ck = Check(a.progress)
    try:
        if a.device == "cpu":
            interpret_triton()
        torch, dev_s = torch_for(a.device, ck, laps)
        policy = json.loads(a.policy_json)
        ck.begin("setup", "load-problem")
        problem = load_problem(a.problem, a.size)
        if a.kernel and not dev_s.startswith("cuda"):
            raise RunnerError("a replacement kernel is verified inside the torch.compile'd problem, which needs a CUDA GPU")
        # A replacement kernel runs inside a compiled problem; gate 4's baseline compiles beside
        # the checks: either way torch.compile's process-wide patches come before the snapshots.
        background = dev_s.startswith("cuda") and not a.no_performance and not a.kernel
        laps.mark("setup.load-problem")
        if a.kernel or background:
            ck.begin("setup", "prime-torch-compile")  # a failure here names it, not the problem's load
            prime_torch_compile(torch.device(dev_s))
            laps.mark("setup.prime-torch-compile")
        timers0, threads0, native0 = timer_identities(), set(threading.enumerate()), native_threads()
        libs0 = library_identities(problem)
        laps.mark("setup.snapshots")
        checking = time.perf_counter()  # torch, the problem, the identities: set up
        dev = torch.device(dev_s)
        checks = functools.partial(run_checks, policy=policy, dev=dev, performance=not a.no_performance, timers0=timers0,
                                   threads0=threads0, libs0=libs0, progress=a.progress, native0=native0)
        res: Dict[str, Any]
        if a.kernel:
            with open(a.candidate) as f:
                kernel = KernelCandidate(problem, a.kernel, f.read(), str(policy.get("baseline_mode", "default")), dev, policy)
            res = checks(problem, kernel)  # the kernel's harness compiles the problem itself
        else:
            res = module_checks(a.candidate, ck, lambda cand: checks(problem, cand, background_compile=background))
        res["device"] = dev_s
        res["phase_seconds"] = {"setup": round(checking - began, 3), **laps.seconds, **res.get("phase_seconds", {})}
        if dev_s == "cpu":
            res["notes"] = ["--device cpu: Triton kernels ran in Triton's interpreter (TRITON_INTERPRET=1 in the candidate process)"]
    except RunnerError as e:
        print(f"kforge verify: {e}", file=sys.stderr)
        if e.fix:
            print(f"kforge verify fix: {e.fix}", file=sys.stderr)
        return 2
    with open(a.out, "w") as f:
        json.dump(finite_json(res), f, default=str, allow_nan=False)
    return 0


def warm_isolation() -> Optional[str]:
    """How the warm worker running this very process runs its jobs (``in-process`` or ``fork``),
    or None outside a warm worker. The worker says so in ``$KFORGE_WARM_ISOLATION`` as
    ``MODE:PID``; a process the job started inherits the variable with another pid: not warm."""
    mode, _, pid = os.environ.get("KFORGE_WARM_ISOLATION", "").partition(":")
    return mode if mode and pid == str(os.getpid()) else None


def exit_now(status: int) -> None:
    """End the process with ``status`` once the result is written: streams flushed, then
    ``os._exit`` — an interpreter's teardown after a GB-scale run (the CUDA context, Inductor's
    compile workers joined one by one) takes seconds and decides nothing. The orchestrator
    ends whatever is left in the candidate's process group. In a warm worker that runs jobs
    in-process (where the runner only refuses) the status is the job's, not the worker's end."""
    sys.stdout.flush()
    sys.stderr.flush()
    if warm_isolation() == "in-process":
        raise SystemExit(status)
    os._exit(status)


if __name__ == "__main__":
    exit_now(main())
