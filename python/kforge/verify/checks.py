"""What the runtime checks of ``kforge verify`` (:mod:`.cascade`) are made of: whose failure an
exception is (the environment's or the candidate's), the identity snapshots of timing and library
functions, NaN sentinels, the candidate's Triton kernels and their launch counter, the fp64 rule
of gate 3, releasing memory between stages.

torch is imported inside the functions that use it (the runner's entry point must start without
torch, to report its absence); Triton is optional.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import kforge

from ..harness import Fp64Reference, allowed_origin, compare, flat, fp64_rule, package_dirs
from .dispatch import prepare


class RunnerError(Exception):
    """The candidate cannot be evaluated here, through no fault of its own (the verdict: could
    not run): the environment (no GPU driver, torch missing, memory held by other processes) or
    bad input (the problem file). ``fix`` names what to do about it."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


#: Memory other processes must hold on the GPU for an out-of-memory error to be theirs rather
#: than the candidate's own: the environment, not a rejection (the daemon's admission retries it).
OTHERS_OOM_BYTES = 1 << 30

NO_DRIVER_FIX = ("run on a machine with a GPU, or pass --device cpu: kforge then runs Triton kernels "
                 "in Triton's interpreter (TRITON_INTERPRET=1)")


def is_oom(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def gpu_memory_split(dev: Any) -> Tuple[int, int, int]:
    """Bytes of GPU ``dev``: (this process's allocator holds, other processes hold, total)."""
    import torch

    free, total = torch.cuda.mem_get_info(dev)
    own = torch.cuda.memory_reserved(dev)
    return own, max(0, total - free - own), total


def environment_error(e: BaseException, dev: Any) -> Optional[RunnerError]:
    """``e``, raised while the candidate ran, if it is the environment's doing: no GPU driver for
    Triton (Triton kernels on a machine without one and not in the interpreter), or CUDA out of
    memory while other processes held at least ``OTHERS_OOM_BYTES`` of the GPU. None when it is
    the candidate's own failure."""
    text = f"{type(e).__name__}: {e}"
    if "active drivers" in text or "Found no NVIDIA driver" in text or "no CUDA-capable device" in text:
        return RunnerError(f"no GPU driver for the candidate's kernels ({text.splitlines()[0]})", NO_DRIVER_FIX)
    if is_oom(e) and dev.type == "cuda":
        own, others, total = gpu_memory_split(dev)
        if others >= OTHERS_OOM_BYTES:
            return RunnerError(f"CUDA out of memory while other processes held {others / 2**30:.1f} GiB of the GPU's "
                               f"{total / 2**30:.1f} GiB (this process: {own / 2**30:.1f} GiB): not the candidate's failure",
                               "retry when the GPU has memory free (kforge verify --daemon: the daemon admits jobs by memory)")
    return None


class CandidateOOM(Exception):
    """The candidate's own out-of-memory error, with whose memory it was."""


def own_failure(e: Exception, dev: Any) -> Exception:
    """``e`` as the candidate's failure; an out-of-memory error says whose memory the GPU held."""
    if is_oom(e) and dev.type == "cuda":
        own, others, total = gpu_memory_split(dev)
        return CandidateOOM(f"{type(e).__name__}: {e} (out of memory: this process held {own / 2**30:.1f} GiB, "
                            f"other processes {others / 2**30:.1f} GiB of {total / 2**30:.1f} GiB)")
    return e


def timer_identities() -> Dict[str, int]:
    """Identities of the functions a timing harness relies on (exploit: patching them)."""
    import torch

    prepare()  # the dispatch record's imports, before any identity or thread is taken

    out = {"time.perf_counter": id(time.perf_counter), "time.perf_counter_ns": id(time.perf_counter_ns),
           "time.time": id(time.time), "time.monotonic": id(time.monotonic),
           "torch.cuda.synchronize": id(torch.cuda.synchronize), "torch.cuda.Event": id(torch.cuda.Event),
           "torch.cuda.Event.record": id(torch.cuda.Event.record), "torch.cuda.Event.elapsed_time": id(torch.cuda.Event.elapsed_time),
           "torch.Tensor.__eq__": id(torch.Tensor.__eq__), "torch.allclose": id(torch.allclose),
           "kforge.do_bench": id(kforge.do_bench), "kforge.do_bench_interleaved": id(kforge.do_bench_interleaved)}
    try:
        import triton.testing

        out["triton.testing.do_bench"] = id(triton.testing.do_bench)
    except ImportError:
        pass
    return out


def library_identities(problem: Any) -> Dict[str, int]:
    """Identities of everything the reference computes with: the public callables of torch,
    torch.nn.functional, torch.Tensor and torch.nn.Module, and the problem module's own globals.
    A candidate that replaces one (``vars(torch)["softmax"] = ...``) changes what the reference
    computes, so that a wrong candidate and a patched reference agree."""
    import torch
    import torch.nn.functional as F

    out: Dict[str, int] = {}
    for prefix, ns in (("torch.", vars(torch)), ("torch.nn.functional.", vars(F)),
                       ("torch.Tensor.", vars(torch.Tensor)), ("torch.nn.Module.", vars(torch.nn.Module)),
                       ("problem.", vars(problem))):
        for k, v in list(ns.items()):
            if not k.startswith("__") and (callable(v) or isinstance(v, type)):
                out[prefix + k] = id(v)
    for k, v in list(vars(problem.Model).items()):
        if callable(v):
            out["problem.Model." + k] = id(v)
    return out


def torch_own_wrapper(key: str, original: int) -> bool:
    """``torch.NAME`` now a wrapper torch itself installed around the original (importing
    ``torch._dynamo`` wraps ``torch.manual_seed``): defined in torch's own files and wrapping
    exactly the object that was there before. Not a replacement by the candidate."""
    import torch

    if not key.startswith("torch.") or key.count(".") != 1:
        return False
    obj = vars(torch).get(key.split(".", 1)[1])
    code = getattr(obj, "__code__", None)
    dirs = package_dirs(("torch",))
    return (id(getattr(obj, "__wrapped__", None)) == original and code is not None
            and allowed_origin(os.path.realpath(str(code.co_filename)), dirs) == "torch")


#: Most NaN blocks planted per output tensor (each is a free block the next allocation may get).
MAX_SENTINELS = 512


def plant_sentinels(like: Any) -> None:
    """NaN-fill the memory an output shaped like ``like`` could next be allocated in, then free
    it: an output the candidate allocates but never writes reads NaN instead of a stale correct
    result (the caching allocator hands out the block the last call's output was copied from).
    On a GPU every cached free block that can serve such an allocation is taken and filled —
    blocks are allocated until the allocator has to reserve new device memory — so call this
    after the call's inputs are prepared, right before the call."""
    import torch

    ts = [t for t in flat(like) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    held = []
    for t in ts:
        if not t.is_cuda:
            held.append(torch.full_like(t, float("nan")))
            continue
        for _ in range(MAX_SENTINELS):
            reserved = torch.cuda.memory_reserved(t.device)
            try:
                block = torch.full_like(t, float("nan"))
            except torch.OutOfMemoryError:
                break
            if torch.cuda.memory_reserved(t.device) != reserved:
                # Fresh device memory: the cached free blocks are all NaN now. Give the new
                # segment back (the others are still held), so that planting does not grow the
                # cache call after call.
                del block
                torch.cuda.empty_cache()
                break
            held.append(block)
    del held


def jit_functions(mod: Any) -> List[Any]:
    """The candidate module's own Triton kernels (``@triton.jit``, also autotuned or interpreted)."""
    try:
        from triton.runtime.jit import KernelInterface
    except ImportError:
        return []
    seen: List[Any] = []
    for v in vars(mod).values():
        if isinstance(v, KernelInterface) and v not in seen:
            seen.append(v)
    return seen


def kernel_name(f: Any) -> str:
    name = getattr(f, "__name__", None)
    return str(name) if name else str(getattr(getattr(f, "fn", None), "__name__", "?"))


class LaunchCounter:
    """Counts launches of the candidate's own Triton kernels; `ghost` makes them no-ops."""

    def __init__(self, fns: Sequence[Any]) -> None:
        self.fns = list(fns)
        self.count = 0
        self.ghost = False
        self._orig: List[Tuple[Any, Any]] = []

    def __enter__(self) -> "LaunchCounter":
        for f in self.fns:
            orig = f.run

            def run(*a: Any, _orig: Any = orig, **k: Any) -> Any:
                self.count += 1
                return None if self.ghost else _orig(*a, **k)

            self._orig.append((f, orig))
            f.run = run
        return self

    def __exit__(self, *exc: object) -> None:
        for f, orig in self._orig:
            f.run = orig


FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")


def model_check(seed: int, out: Any, ref: Any, inputs: Callable[[], List[Any]], strict: Dict[str, Any],
                fp64: Fp64Reference) -> Tuple[str, bool, Dict[str, Any]]:
    """Gate 3 for one seed: ``out`` against the fp32 reference ``ref`` at 1e-4, else the fp64
    rule on the seed's inputs (made by ``inputs`` only then): (check name, passed, evidence)."""
    r = compare(out, ref, strict)
    if r["ok"]:
        return f"eager-1e-4-seed-{seed}", True, r
    f = fp64_rule(fp64, out, ref, inputs())
    return f"fp64-seed-{seed}", bool(f["ok"]), f


def release(dev: Any) -> None:
    """Between stages: the caching allocator's free blocks go back to the device, so that the
    memory a stage no longer needs is free for sibling jobs (the daemon admits by what NVML sees)."""
    import torch

    if dev.type == "cuda":
        torch.cuda.empty_cache()
