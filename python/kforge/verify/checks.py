"""The runtime checks of ``kforge verify`` on a problem and a candidate: the dry run; gate 2
(seeds x input distributions, NaN sentinels, ragged sizes, inputs unchanged); gate 3 (eager at
1e-4, else the fp64 rule); the exploit checks (determinism, input perturbation, re-validation,
threads, timer and library identity, ghost replay, kernels ran, side streams); then gate 4
(:mod:`.perf`) on a GPU.

torch is imported inside the functions that use it (the runner's entry point must start without
torch, to report its absence); Triton is optional.
"""

from __future__ import annotations

import copy
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

import kforge

from ..harness import (DISTRIBUTIONS, Check, allowed_origin, clone_all, clone_output, compare, flat, make_inputs, max_abs,
                       max_abs_diff, package_dirs, same_values, thread_check)
from .dispatch import DispatchRecord, prepare
from .native import NativeCounter, kernel_streams, native_functions
from .perf import BaselineCompile, performance_gate


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


def environment_error(e: BaseException, dev: Any) -> Optional[RunnerError]:
    """``e``, raised while the candidate ran, if it is the environment's doing: no GPU driver for
    Triton (Triton kernels on a machine without one and not in the interpreter), or CUDA out of
    memory while other processes held at least ``OTHERS_OOM_BYTES`` of the GPU. None when it is
    the candidate's own failure."""
    import torch

    text = f"{type(e).__name__}: {e}"
    if "active drivers" in text or "Found no NVIDIA driver" in text or "no CUDA-capable device" in text:
        return RunnerError(f"no GPU driver for the candidate's kernels ({text.splitlines()[0]})", NO_DRIVER_FIX)
    if is_oom(e) and dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        own = torch.cuda.memory_reserved(dev)
        others = max(0, total - free - own)
        if others >= OTHERS_OOM_BYTES:
            return RunnerError(f"CUDA out of memory while other processes held {others / 2**30:.1f} GiB of the GPU's "
                               f"{total / 2**30:.1f} GiB (this process: {own / 2**30:.1f} GiB): not the candidate's failure",
                               "retry when the GPU has memory free (kforge verify --daemon: the daemon admits jobs by memory)")
    return None


class CandidateOOM(Exception):
    """The candidate's own out-of-memory error, with whose memory it was."""


def own_failure(e: Exception, dev: Any) -> Exception:
    """``e`` as the candidate's failure; an out-of-memory error says whose memory the GPU held."""
    import torch

    if is_oom(e) and dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        own = torch.cuda.memory_reserved(dev)
        return CandidateOOM(f"{type(e).__name__}: {e} (out of memory: this process held {own / 2**30:.1f} GiB, "
                            f"other processes {max(0, total - free - own) / 2**30:.1f} GiB of {total / 2**30:.1f} GiB)")
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


class Fp64Reference:
    """The reference model in fp64, made once (on first use) and shared by every seed's fp64
    rule; ``release`` frees it."""

    def __init__(self, ref_model: Any) -> None:
        self.ref_model = ref_model
        self._m64: Any = None

    def outputs(self, xs: Sequence[Any]) -> List[Any]:
        """The fp64 reference's outputs for ``xs`` (floating-point inputs promoted to fp64)."""
        import torch

        if self._m64 is None:
            self._m64 = copy.deepcopy(self.ref_model).double()
        x64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]
        with torch.no_grad():
            return flat(self._m64(*x64))

    def release(self) -> None:
        self._m64 = None


def model_check(seed: int, out: Any, ref: Any, inputs: Callable[[], List[Any]], strict: Dict[str, Any],
                fp64: Fp64Reference) -> Tuple[str, bool, Dict[str, Any]]:
    """Gate 3 for one seed: ``out`` against the fp32 reference ``ref`` at 1e-4, else the fp64
    rule on the seed's inputs (made by ``inputs`` only then): (check name, passed, evidence)."""
    r = compare(out, ref, strict)
    if r["ok"]:
        return f"eager-1e-4-seed-{seed}", True, r
    f = fp64_rule(fp64, out, ref, inputs())
    return f"fp64-seed-{seed}", bool(f["ok"]), f


def fp64_rule(fp64: Fp64Reference, cand_out: Any, base_out: Any, xs: Sequence[Any]) -> Dict[str, Any]:
    """rho = ||candidate - fp64 reference||inf / ||fp32 baseline - fp64 reference||inf <= 10;
    exact operations (baseline error < 1e-8): relative error <= 1e-4."""
    if isinstance(cand_out, BaseException):
        return {"ok": False, "rule": "fp64", "why": f"the candidate raised {type(cand_out).__name__}: {cand_out}"}
    r64 = fp64.outputs(xs)
    c, b = flat(cand_out), flat(base_out)
    shapes = [(tuple(ci.shape), tuple(ri.shape)) for ci, ri in zip(c, r64) if ci.shape != ri.shape]
    if len(c) != len(r64) or shapes:
        return {"ok": False, "rule": "fp64", "why": f"output shapes differ from the reference's: {shapes[:3] or (len(c), len(r64))}"}
    d_opt = max(max_abs_diff(ci, ri) for ci, ri in zip(c, r64))
    d_ref = max(max_abs_diff(bi, ri) for bi, ri in zip(b, r64))
    if d_ref < 1e-8:
        scale = max(max_abs(ri) for ri in r64) or 1.0
        rel = d_opt / scale
        return {"ok": rel <= 1e-4, "rule": "fp64-exact", "relative_error": rel}
    rho = d_opt / d_ref
    return {"ok": rho <= 10.0, "rule": "fp64-ratio", "rho": rho, "d_opt": d_opt, "d_ref": d_ref}


def release(dev: Any) -> None:
    """Between stages: the caching allocator's free blocks go back to the device, so that the
    memory a stage no longer needs is free for sibling jobs (the daemon admits by what NVML sees)."""
    import torch

    if dev.type == "cuda":
        torch.cuda.empty_cache()


def run_checks(problem: Any, candidate: Any, policy: Dict[str, Any], dev: Any, performance: bool,
               timers0: Dict[str, int], threads0: Set[Any], libs0: Optional[Dict[str, int]] = None,
               progress: Optional[str] = None, native0: Optional[Dict[int, str]] = None,
               background_compile: bool = False) -> Dict[str, Any]:
    """All runtime checks; ``timers0`` and ``threads0`` were taken before the candidate was imported.

    ``candidate`` is the candidate's module (a ``ModelNew`` file) or, for a replacement kernel, a
    ``kernel.KernelCandidate`` (the compiled model re-stitched with the kernel). With
    ``background_compile`` (the caller primed torch.compile before its identity snapshots) the
    baseline of gate 4 compiles in a thread while the checks run (``perf.BaselineCompile``)."""
    import torch

    began = time.perf_counter()
    ck = Check(progress)
    seeds = list(range(int(policy.get("seeds", 3))))
    torch.manual_seed(0)
    init = problem.get_init_inputs()
    torch.manual_seed(1234)
    ref_model = problem.Model(*init).to(dev).eval()
    torch.manual_seed(1234)
    if hasattr(candidate, "restitch"):  # a replacement kernel
        ck.begin("dry-run", "compile-and-restitch")
        try:
            cand, fns = candidate.restitch(ref_model, ck)
        except Exception as e:
            ck.add("dry-run", "compile-and-restitch", False, error=f"{type(e).__name__}: {e}")
            return {"checks": ck.items}
        # The harness compiled the problem (Inductor's compile threads); a thread the candidate's
        # calls start is still counted (its source's imports and threads are gate 1's).
        threads0 = threads0 | set(threading.enumerate())
    else:
        ck.begin("dry-run", "construct")
        try:
            cand = candidate.ModelNew(*init).to(dev).eval()
        except Exception as e:
            env = environment_error(e, dev)
            if env is not None:
                raise env from e
            e = own_failure(e, dev)
            ck.add("dry-run", "construct", False, error=f"{type(e).__name__}: {e}")
            return {"checks": ck.items}
        try:  # same weights as the reference where the parameter names agree
            cand.load_state_dict(ref_model.state_dict(), strict=False)
        except Exception:
            pass
        fns = jit_functions(candidate)
    nfns = native_functions(candidate, cand) if not hasattr(candidate, "restitch") else []

    record = DispatchRecord(policy, applies=not hasattr(candidate, "restitch"))

    def call(xs: Sequence[Any]) -> Any:
        """A copy of the candidate's output (a CUDA-graph replay overwrites its outputs on the
        next replay), or the exception it raised (then every comparison fails). The aten ops
        its forward dispatches are recorded (``record``)."""
        try:
            with torch.no_grad():
                with record:
                    out = cand(*xs)
                return clone_output(out)
        except Exception as e:
            env = environment_error(e, dev)
            if env is not None:
                raise env from e
            return own_failure(e, dev)

    # Dry run.
    ck.begin("dry-run", "runs")
    xs = make_inputs(problem, 0, "normal", dev)
    with torch.no_grad():
        with record.of_reference():  # what the reference dispatches (are copies its work?)
            ref_model(*clone_all(xs))
    try:
        with LaunchCounter(fns) as lc, NativeCounter(nfns) as nc:
            out0 = call(xs)
            if dev.type == "cuda":
                torch.cuda.synchronize()
        if isinstance(out0, BaseException):
            ck.add("dry-run", "runs", False, error=f"{type(out0).__name__}: {out0}")
            return {"checks": ck.items}
        ck.add("dry-run", "runs", True, kernel_launches=lc.count, native_calls=nc.calls)
    except RunnerError:
        raise
    except Exception as e:
        ck.add("dry-run", "runs", False, error=f"{type(e).__name__}: {e}")
        return {"checks": ck.items}
    if not hasattr(candidate, "restitch"):  # an extension built lazily, in the first forward
        nfns = native_functions(candidate, cand)
    # The baseline compiles beside the checks (gate 4 needs it; the checks do not).
    compiled = (BaselineCompile(ref_model, str(policy.get("baseline_mode", "default")), make_inputs(problem, 399, "normal", dev))
                if performance and dev.type == "cuda" and background_compile else None)

    # Gate 2: seeds x distributions. Gate 3 (model level) shares the runs of the first three
    # seeds' normal inputs: the same candidate output, judged at 1e-4, else by the fp64 rule.
    strict = {"rtol": {k: 1e-4 for k in FLOAT_DTYPES}, "atol": {k: 1e-4 for k in FLOAT_DTYPES}}
    fp64 = Fp64Reference(ref_model)
    model: List[Tuple[str, bool, Dict[str, Any]]] = []
    for s in seeds:
        for dist in DISTRIBUTIONS:
            ck.begin("correctness", f"seed-{s}-{dist}")
            # Inputs are regenerated instead of copied (make_inputs is deterministic and takes
            # milliseconds on a GPU): the reference runs on a set of its own, the candidate on a
            # fresh one, and a third, made after its call, shows whether it changed its inputs.
            # At GB sizes each copy not kept is an input set of device memory less per job.
            with torch.no_grad():
                ref = ref_model(*make_inputs(problem, 100 + s, dist, dev))
            xs = make_inputs(problem, 100 + s, dist, dev)
            plant_sentinels(ref)
            out = call(xs)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            r = compare(out, ref, policy)
            unchanged = same_values(xs, make_inputs(problem, 100 + s, dist, dev))
            ok = r["ok"] and unchanged
            ck.add("correctness", f"seed-{s}-{dist}", ok, **r, inputs_unchanged=unchanged)
            if dist == "normal" and s in seeds[:3]:
                model.append(model_check(s, out, ref, lambda: make_inputs(problem, 100 + s, dist, dev), strict, fp64))
            del xs, ref, out
    fp64.release()
    release(dev)

    # Gate 2, ragged sizes: module-level size variables set to the policy's values.
    kernel_mode = hasattr(candidate, "restitch")
    if kernel_mode and policy.get("ragged"):
        ck.add("correctness", "ragged", None, note="a replacement kernel is specialized to the compiled shapes")
    for name, value in ({} if kernel_mode else dict(policy.get("ragged", {}))).items():
        if not isinstance(getattr(problem, name, None), int):
            raise RunnerError(f"policy: ragged size {name} is not a module-level integer of the problem")
        own = getattr(problem, name)
        setattr(problem, name, int(value))
        try:
            for s in seeds:
                ck.begin("correctness", f"ragged-{name}={value}-seed-{s}")
                xs = make_inputs(problem, 150 + s, DISTRIBUTIONS[s % len(DISTRIBUTIONS)], dev)
                keep = clone_all(xs)
                with torch.no_grad():
                    ref = ref_model(*clone_all(xs))
                plant_sentinels(ref)
                r = compare(call(xs), ref, policy)
                unchanged = same_values(xs, keep)
                ck.add("correctness", f"ragged-{name}={value}-seed-{s}", r["ok"] and unchanged, **r, inputs_unchanged=unchanged)
        finally:
            setattr(problem, name, own)

    # Gate 3: model level at 1e-4 on 3 seeds, else the fp64 rule (judged above, on gate 2's runs).
    for name, ok, evidence in model:
        ck.add("model", name, ok, **evidence)
    release(dev)

    # Exploit checks.
    ck.begin("exploits", "determinism")
    xs = make_inputs(problem, 300, "normal", dev)
    a, b = call(clone_all(xs)), call(clone_all(xs))
    det = compare(a, b, policy)
    ck.add("exploits", "determinism", det["ok"], **det)

    ck.begin("exploits", "input-perturbation")
    xs = make_inputs(problem, 301, "normal", dev)
    first = call(xs)
    new = make_inputs(problem, 302, "uniform", dev)
    for x, n in zip(xs, new):
        if isinstance(x, torch.Tensor):
            # Same tensor objects, same storage, same version counter (written through .data),
            # new contents: a cache keyed on id, data_ptr or _version returns a stale result.
            x.data.copy_(n)
    with torch.no_grad():
        ref_new = ref_model(*clone_all(xs))
    plant_sentinels(ref_new)
    second = call(xs)
    follows = compare(second, ref_new, policy)
    ck.add("exploits", "input-perturbation", follows["ok"], **follows)

    ck.begin("exploits", "revalidation")
    xs = make_inputs(problem, 303, "normal", dev)
    for _ in range(int(policy.get("revalidate_calls", 10))):
        call(xs)
    with torch.no_grad():
        ref = ref_model(*clone_all(xs))
    plant_sentinels(ref)
    late = compare(call(xs), ref, policy)
    ck.add("exploits", "revalidation", late["ok"], after_calls=int(policy.get("revalidate_calls", 10)), **late)

    del xs, out0, a, b, first, new, ref_new, second, ref
    if compiled is not None:
        compiled.wait()  # its thread is kforge's, not the candidate's: gone before threads are counted
    release(dev)
    thread_check(ck, "thread-count", threads0, kernel_mode, native_before=native0)
    timers1 = timer_identities()
    changed = sorted(k for k in timers0 if timers0[k] != timers1.get(k))
    ck.add("exploits", "timer-identity", not changed, replaced=changed)
    if libs0 is not None:
        libs1 = library_identities(problem)
        replaced = sorted(k for k in libs0 if libs1.get(k) != libs0[k] and not torch_own_wrapper(k, libs0[k]))
        added = sorted(k for k in libs1 if k not in libs0 and k.startswith(("torch.Tensor.", "torch.nn.Module.", "problem.Model.")))
        ck.add("exploits", "library-identity", not replaced and not added, replaced=replaced[:20], added=added[:20],
               note="the reference's functions were replaced: the reference no longer computes the reference" if replaced or added else "")

    if kernel_mode and getattr(candidate, "cuda_graphs", False):
        for n in ("ghost-replay", "kernels-ran"):
            ck.add("exploits", n, None, note="under CUDA graphs the graph replays the launches; the per-kernel replay checked the kernel")
    elif fns or nfns:
        ck.begin("exploits", "ghost-replay")
        xs = make_inputs(problem, 304, "normal", dev)
        real = call(clone_all(xs))
        with LaunchCounter(fns) as lc, NativeCounter(nfns, ghost=True) as ng:
            lc.ghost = True
            args = clone_all(xs)
            plant_sentinels(real)
            try:
                same = compare(call(args), real, {"rtol": {}, "atol": {}})["ok"]
            except Exception:  # a no-op kernel breaking the candidate is a change too
                same = False
        names = {"kernels": [kernel_name(f) for f in fns], "native_functions": [n for n, _ in nfns]}
        if ng.bypassed:  # the real native code ran in the ghost replay: it cannot conclude
            ck.add("exploits", "ghost-replay", False, **names, native_bypassed=ng.bypassed,
                   note="a native function was called through a reference kforge could not replace, so the replay with "
                        "the native code made a no-op cannot conclude: hold the extension module (or its functions) in "
                        "a module global or a ModelNew attribute")
        else:
            ck.add("exploits", "ghost-replay", not same, **names, native_ghost_calls=ng.calls,
                   note="outputs with the candidate's kernels made no-ops " + ("equal the real ones: the kernels never mattered" if same else "differ"))
        with LaunchCounter(fns) as lc, NativeCounter(nfns) as nc:
            call(clone_all(xs))
        ck.add("exploits", "kernels-ran", lc.count + nc.count > 0, launches=lc.count, native_calls=nc.calls)
    else:
        ck.add("exploits", "ghost-replay", False, kernels=[], native_functions=[],
               note="the candidate defines no Triton kernel and holds no native extension of its own")
        ck.add("exploits", "kernels-ran", False, launches=0, note="no Triton kernel or native function to run")

    if dev.type == "cuda":
        ck.begin("exploits", "streams-synchronized")
        xs = make_inputs(problem, 305, "normal", dev)
        with torch.no_grad():
            out = cand(*xs)
            torch.cuda.current_stream().synchronize()
            early = [t.clone() for t in flat(out)]
            torch.cuda.synchronize()
        late_ok = all(torch.equal(e, t) for e, t in zip(early, flat(out)))
        # Native code launches where the static gate cannot see: which stream each kernel of a
        # forward ran on (torch.profiler), not only whether a race happened to show.
        with torch.no_grad():
            streams = kernel_streams(lambda: cand(*clone_all(xs))) if nfns else {}
        off = streams.get("off_stream", [])
        ck.add("exploits", "streams-synchronized", late_ok and not off, native_streams=streams,
               note="output read after the current stream vs after the whole device synchronized"
                    + (f"; {len(off)} kernel(s) of the native code ran off the current stream" if off else ""))
    else:
        ck.add("exploits", "streams-synchronized", None, note="CPU run: no streams")

    release(dev)
    record.check(ck)
    failed = [f"{c['gate']}:{c['name']}" for c in ck.items if c["ok"] is False]
    if performance and dev.type == "cuda" and failed:
        ck.add("performance", "speedup", None, note=f"not timed: already rejected by {failed[0]}")
    elif performance and dev.type == "cuda":
        checked = time.perf_counter()
        ck.begin("performance", "speedup")
        phases = performance_gate(ck, problem, ref_model, cand, policy, dev, compiled)
        if compiled is not None:
            phases["baseline-compile-beside-checks"] = round(compiled.seconds, 3)
        return {"checks": ck.items, "phase_seconds": {"checks": round(checked - began, 3), **phases}}
    else:
        ck.add("performance", "speedup", None, note="needs a GPU" if dev.type != "cuda" else "not requested")
    return {"checks": ck.items, "phase_seconds": {"checks": round(time.perf_counter() - began, 3)}}
