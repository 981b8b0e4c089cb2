"""Capture a ``torch.compile``d problem for ``kforge inspect`` (runs on a GPU).

``python3 -m kforge.capture SOURCE.py --out CAPTURE.json [--mode default] [--iterations 5]``

SOURCE is a KernelBench-format problem (``class Model``, ``get_inputs()``,
``get_init_inputs()``) or a standalone Triton kernel file (``kernel_function(*inputs)``,
``get_inputs()``). For a problem the capture holds:

* ``wrappers``: the Inductor wrapper modules' code (parsed into an inventory by the Rust side,
  ``kforge-inductor``);
* ``iterations``: the GPU kernels of a few profiled runs of the compiled model, in order, with
  durations (``kforge_inductor::profile::attribute`` attributes them to the inventory);
* ``check``: compiled vs eager output;
* ``replay``: every Triton kernel launch's real arguments recorded on one run, then the kernel
  run alone on copies of them and compared with what it produced inside the model;
* ``restitch``: a fresh compile in which every Triton kernel is replaced by a kernel compiled
  from its own source (``restitch``; the same CUDA-graph setting as the mode), outputs compared
  with the unmodified compiled model and both timed.

Bad input gives one line on stderr naming the file and the cause, and exit status 2.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import sys
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .verify_runner import clone_all, clone_output, finite_json

CAPTURE_VERSION = 1
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


class CaptureError(Exception):
    """An input that cannot be inspected; the message names the file and the cause."""


def load_source(path: str) -> Tuple[str, Any]:
    """Import SOURCE and tell what it is: ``("problem", module)`` or ``("triton", module)``."""
    if not os.path.isfile(path):
        raise CaptureError(f"{path}: no such file")
    name = "kforge_inspect_" + "".join(c if c.isalnum() else "_" for c in os.path.basename(path))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise CaptureError(f"{path}: not a Python file")
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except SyntaxError as e:
        raise CaptureError(f"{path}: syntax error at line {e.lineno}: {e.msg}") from e
    except Exception as e:  # the file's own import-time failure, whatever it is
        raise CaptureError(f"{path}: importing it failed: {type(e).__name__}: {e}") from e

    def has(fn: str) -> bool:
        return callable(getattr(mod, fn, None))

    if not has("get_inputs"):
        raise CaptureError(f"{path}: no get_inputs() function (a problem needs class Model, get_inputs() "
                           "and get_init_inputs(); a Triton kernel file kernel_function(*inputs) and get_inputs())")
    if isinstance(getattr(mod, "Model", None), type):
        if not has("get_init_inputs"):
            raise CaptureError(f"{path}: class Model but no get_init_inputs() function")
        return "problem", mod
    if has("kernel_function"):
        return "triton", mod
    raise CaptureError(f"{path}: neither a problem (no class Model) nor a Triton kernel file (no kernel_function)")


def kernel_sources(wrapper_code: str) -> Dict[str, str]:
    """``name = async_compile.triton('name', '''source''', ...)`` definitions of a wrapper."""
    out: Dict[str, str] = {}
    for node in ast.parse(wrapper_code).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        call = node.value
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "triton"):
            continue
        if len(call.args) >= 2 and isinstance(call.args[1], ast.Constant) and isinstance(call.args[1].value, str):
            out[node.targets[0].id] = call.args[1].value
    return out


def _is_triton_jit(d: ast.expr) -> bool:
    target = d.func if isinstance(d, ast.Call) else d
    return isinstance(target, ast.Attribute) and target.attr == "jit" and isinstance(target.value, ast.Name) and target.value.id == "triton"


def kernel_for_interpreter(source: str, name: str) -> Any:
    """The ``@triton.jit`` function ``name`` of an Inductor kernel source, without Inductor's
    autotuning decorator (``@triton_heuristics.*``) and GPU-driver set-up, so that it can be
    launched directly — with ``TRITON_INTERPRET=1`` on CPU tensors: per-kernel replay without a GPU.
    Launch it as ``fn[grid](*args, XBLOCK=...)``; the grid and block sizes are the caller's."""
    tree = ast.parse(source)
    body: List[ast.stmt] = []
    found = False
    for node in tree.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Attribute) \
                and node.value.func.attr == "set_driver_to_gpu":
            continue
        if isinstance(node, ast.FunctionDef) and node.name == name:
            node.decorator_list = [d for d in node.decorator_list if _is_triton_jit(d)]
            found = bool(node.decorator_list)
        body.append(node)
    if not found:
        raise CaptureError(f"kernel {name}: no @triton.jit function of that name in its source")
    tree.body = body
    ns: Dict[str, Any] = {"__file__": f"<kforge replay {name}>", "__name__": f"kforge_replay_{name}"}
    exec(compile(tree, f"<kforge replay {name}>", "exec"), ns)
    return ns[name]


def group_iterations(events: Sequence[Dict[str, Any]], iterations: int) -> List[List[Dict[str, Any]]]:
    """Split a chrome trace's events into per-iteration kernel lists.

    Kernels (``cat == "kernel"``) are grouped by the GPU-side ``kforge_iter_N`` annotations that
    contain them; else by the CPU-side ``kforge_iter_N`` range containing their launch (matched
    through the correlation id); else, sorted by start, split into equal parts (the capture
    synchronizes after every iteration, so each iteration's kernels are contiguous).
    """
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: float(e.get("ts", 0)))
    marks = sorted(
        (e for e in events if e.get("cat") == "gpu_user_annotation" and str(e.get("name", "")).startswith("kforge_iter_")),
        key=lambda e: float(e.get("ts", 0)),
    )
    out: List[List[Dict[str, Any]]] = []
    if not kernels:
        return out

    def ev(k: Dict[str, Any]) -> Dict[str, Any]:
        return {"name": k["name"], "dur_us": float(k.get("dur", 0))}

    if len(marks) == iterations:
        for m in marks:
            lo, hi = float(m["ts"]), float(m["ts"]) + float(m.get("dur", 0))
            out.append([ev(k) for k in kernels if lo <= float(k["ts"]) <= hi])
        return out
    # Inductor wraps each compiled call in its own record_function, so the GPU-side annotations
    # may name that instead: map each kernel to the CPU-side kforge_iter_N range through the
    # launch (runtime) event with the same correlation id.
    cpu_marks = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("kforge_iter_")),
        key=lambda e: float(e.get("ts", 0)),
    )
    launch_ts = {e.get("args", {}).get("correlation"): float(e.get("ts", 0))
                 for e in events if e.get("cat") == "cuda_runtime" and e.get("args", {}).get("correlation") is not None}
    if len(cpu_marks) == iterations and launch_ts:
        groups: List[List[Dict[str, Any]]] = [[] for _ in cpu_marks]
        placed = 0
        for k in kernels:
            t = launch_ts.get(k.get("args", {}).get("correlation"))
            if t is None:
                continue
            for i, m in enumerate(cpu_marks):
                if float(m["ts"]) <= t <= float(m["ts"]) + float(m.get("dur", 0)):
                    groups[i].append(ev(k))
                    placed += 1
                    break
        if placed:
            return groups
    if iterations <= 0 or len(kernels) % iterations != 0:
        return [[ev(k) for k in kernels]]
    per = len(kernels) // iterations
    for i in range(iterations):
        out.append([ev(k) for k in kernels[i * per:(i + 1) * per]])
    return out


# --- torch side (GPU) --------------------------------------------------------------------------


def _to_device(x: Any, dev: Any) -> Any:
    import torch

    return x.to(dev) if isinstance(x, torch.Tensor) else x


def copy_strided(x: Any, dev: Any) -> Any:
    """A copy of tensor ``x`` on ``dev`` with exactly its sizes and strides — also padded or
    overlapping-free strided views, which ``.to``/``.clone`` would make dense (a generated kernel
    indexes with the strides it was compiled for). Non-tensors are returned as they are."""
    import torch

    if not isinstance(x, torch.Tensor):
        return x
    out = torch.empty_strided(x.size(), x.stride(), dtype=x.dtype, device=dev)
    out.copy_(x)
    return out


def _to_host(xs: Sequence[Any]) -> List[Any]:
    """Host copies of a launch's arguments (same sizes and strides)."""
    return [copy_strided(x, "cpu") for x in xs]


def _to_device_all(xs: Sequence[Any], dev: Any) -> List[Any]:
    return [copy_strided(x, dev) for x in xs]


def _max_abs_diff(a: Any, b: Any) -> float:
    import torch

    if isinstance(a, (list, tuple)):
        return max([_max_abs_diff(x, y) for x, y in zip(a, b)] or [0.0])
    if isinstance(a, torch.Tensor):
        if a.shape != b.shape:
            return float("inf")
        if a.numel() == 0:
            return 0.0
        return float((a.double() - b.double()).abs().max().item())
    return 0.0 if a == b else float("inf")


def _identical(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_identical(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype):
            return False
        if a.is_floating_point() or a.is_complex():
            # Bit-for-bit up to NaN: buffers with never-written (NaN) padding are equal where both are NaN.
            return bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
        return bool(torch.equal(a, b))
    return bool(a == b)


class _WrapperHook:
    """Collects the Inductor wrapper modules loaded while active (``PyCodeCache.load_by_key_path``);
    ``on_load`` sees each as soon as it is loaded, before the compiled model first calls it."""

    def __init__(self, on_load: Optional[Callable[[Any], None]] = None, private_from: Sequence[Any] = ()) -> None:
        self.modules: List[Any] = []
        self._orig: Optional[Callable[..., Any]] = None
        self._known = 0
        self._on_load = on_load
        # Inductor caches a wrapper module by its source: a second compile that generates the same
        # code gets the first one's module object. Such a module is loaded again, privately.
        self._private_from = list(private_from)

    def __enter__(self) -> "_WrapperHook":
        from torch._inductor.codecache import PyCodeCache

        orig = PyCodeCache.load_by_key_path
        self._orig = orig
        self._known = len(getattr(PyCodeCache, "modules", []))

        def load(*args: Any, **kwargs: Any) -> Any:
            m = orig(*args, **kwargs)
            if any(m is p for p in self._private_from):
                m = private_copy(m)
            if hasattr(m, "call"):  # wrapper modules define call(args); kernel modules do not
                self.modules.append(m)
                if self._on_load is not None:
                    self._on_load(m)
            return m

        PyCodeCache.load_by_key_path = staticmethod(load)  # type: ignore[method-assign, assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        from torch._inductor.codecache import PyCodeCache

        if self._orig is not None:
            PyCodeCache.load_by_key_path = self._orig  # type: ignore[method-assign]
        # Also what PyCodeCache recorded meanwhile (a loader that bypassed load_by_key_path).
        for m in list(getattr(PyCodeCache, "modules", []))[self._known:]:
            if hasattr(m, "call") and m not in self.modules and not any(m is p for p in self._private_from):
                self.modules.append(m)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def private_copy(mod: Any) -> Any:
    """The module ``mod`` loaded again from its file, as a new module object with its own globals
    (its kernels are looked up there: replacing one does not touch ``mod``); attributes set on
    ``mod`` after it ran (Inductor's constants) are carried over."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{mod.__name__}_kforge_private", mod.__file__)
    if spec is None or spec.loader is None:
        raise CaptureError(f"cannot load {mod.__file__} again")
    new = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(new)
    for k, v in vars(mod).items():
        if k not in vars(new):
            setattr(new, k, v)
    return new


def _triton_globals(mod: Any) -> Dict[str, Any]:
    return {n: o for n, o in vars(mod).items() if n.startswith("triton_") and hasattr(o, "run") and hasattr(o, "fn")}


def own_code_class(cls: Any) -> Any:
    """A subclass of model class ``cls`` whose ``forward`` is a copy on a new code object. Dynamo
    caches compiled code per code object: two torch.compile'd models of one class may share a
    cache entry (then one runs the other's code), and entries on one code object are tried in
    turn (the later one pays for the earlier one's guards) — a compile of this class has its own."""
    import types

    f = cls.forward
    fwd = types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    return type(f"{cls.__name__}_kforge_own_code", (cls,), {"forward": fwd})


def _compile(problem: Any, mode: str, dev: Any, second: bool = False) -> Tuple[Any, Any, List[Any]]:
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
    torch.manual_seed(0)
    model = cls(*[_to_device(x, dev) for x in problem.get_init_inputs()]).to(dev).eval()
    torch.manual_seed(1)
    inputs = [_to_device(x, dev) for x in problem.get_inputs()]
    # Static shapes: a replacement kernel is specialized to the shapes it was generated for.
    return model, torch.compile(model, mode=mode, dynamic=False), inputs


def _median(xs: List[Optional[float]]) -> Optional[float]:
    vals = sorted(x for x in xs if x is not None)
    return vals[len(vals) // 2] if vals else None


def interleaved_ratio(time_round: Callable[[], Tuple[float, float, float]], rounds: int = 5) -> Dict[str, Any]:
    """new/base over rounds of ``time_round()`` → (base, new, base again) in ms: the geometric-mean
    ratio with its 95 % interval, and the noise floor — the upper end of that interval for
    base-again/base. ``within_noise``: the ratio's interval reaches into the band the baseline
    shows against itself."""
    import math

    from .verify_perf import _mean_half

    per_round, logs, noise = [], [], []
    for _ in range(max(2, rounds)):
        tb, tn, tb2 = time_round()
        per_round.append({"base_ms": tb, "new_ms": tn, "base_again_ms": tb2})
        logs.append(math.log(tn / tb))
        noise.append(math.log(tb2 / tb))
    mean, half = _mean_half(logs)
    nmean, nhalf = _mean_half(noise)
    floor = abs(nmean) + nhalf
    return {"ratio": math.exp(mean), "ratio_ci95": [math.exp(mean - half), math.exp(mean + half)], "noise_floor": math.exp(floor),
            "within_noise": mean - half <= floor and mean + half >= -floor, "per_round": per_round}


def _round_ms(base: Callable[[], Any], new: Callable[[], Any]) -> Tuple[float, float, float]:
    """Baseline, re-stitched and baseline again, call by call in turn in one region (about 50 ms
    of calls: the round trip takes 5 rounds, in regions that on a shared GPU hold every other job).
    Every timed call follows an untimed call of the same function: without CUDA graphs the two
    are one model whose kernels are switched in its wrapper module, and a call right after the
    switch runs on CPU caches warmed by the other kernels — on the H200 host-bound GRU and LSTM
    models (64 kernels) timed 9–13 % slower with replacements so timed, at the same device time
    and the same host time per call when called in a row."""
    import statistics

    from .bench import do_bench_interleaved

    a, b, c = do_bench_interleaved([base, new, base], warmup=10, rep=50, name="inspect:round-trip",
                                   prepare_each=[base, new, base])
    return statistics.median(a), statistics.median(b), statistics.median(c)


def _time_ms(fn: Callable[[], Any]) -> float:
    """A median over about 50 ms of calls (the round trip takes 15 of these, in regions that, on a
    shared GPU, hold every other job)."""
    from .verify_perf import _ms

    return _ms(fn, "inspect", warmup=10, rep=50, count_host=True)


#: Trace categories of device work: kernels, copies, memsets.
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def device_totals(events: Sequence[Dict[str, Any]], calls: int) -> Dict[str, Dict[str, float]]:
    """Per name of device work in a trace of ``calls`` calls: launches and microseconds per call."""
    out: Dict[str, Dict[str, float]] = {}
    for e in events:
        if e.get("cat") in DEVICE_CATEGORIES:
            t = out.setdefault(str(e.get("name", "?")), {"count": 0.0, "us": 0.0})
            t["count"] += 1.0 / calls
            t["us"] += float(e.get("dur", 0)) / calls
    return out


def explain_difference(base: Dict[str, Dict[str, float]], new: Dict[str, Dict[str, float]],
                       base_host_us: float, new_host_us: float, top: int = 6) -> Dict[str, Any]:
    """What differs between two runs of a model, per call: device work by name (launches that
    only one side makes, and time), and host time. ``why``: one line, largest differences first —
    the reason a round trip is beyond noise, in its table."""
    rows: List[Dict[str, Any]] = []
    for name in sorted(set(base) | set(new)):
        b, n = base.get(name, {"count": 0.0, "us": 0.0}), new.get(name, {"count": 0.0, "us": 0.0})
        rows.append({"name": name, "base_count": round(b["count"], 2), "new_count": round(n["count"], 2),
                     "base_us": round(b["us"], 2), "new_us": round(n["us"], 2), "delta_us": round(n["us"] - b["us"], 2)})
    # Launches only one side makes (or makes more often) first, then by the time they differ.
    rows.sort(key=lambda r: (r["base_count"] == r["new_count"], -abs(r["delta_us"])))
    dev_b, dev_n = sum(r["base_us"] for r in rows), sum(r["new_us"] for r in rows)
    parts = []
    host_delta = new_host_us - base_host_us
    if abs(host_delta) > 0.02 * max(base_host_us, 1.0):
        parts.append(f"host {host_delta:+.0f} µs/call ({base_host_us:.0f} → {new_host_us:.0f})")
    if abs(dev_n - dev_b) > 0.005 * max(dev_b, 1.0):
        parts.append(f"device {dev_n - dev_b:+.1f} µs/call ({dev_b:.1f} → {dev_n:.1f})")
    notable = [r for r in rows if r["base_count"] != r["new_count"] or abs(r["delta_us"]) >= max(1.0, 0.005 * dev_b)]
    for r in notable[:top]:
        short = r["name"] if len(r["name"]) <= 48 else r["name"][:45] + "..."
        count = "" if r["base_count"] == r["new_count"] else f" ×{r['base_count']:g}→{r['new_count']:g}"
        parts.append(f"{short}{count} {r['delta_us']:+.1f} µs")
    return {"why": "; ".join(parts) or "no difference in device work or host time per call",
            "host_us": {"base": round(base_host_us, 1), "new": round(new_host_us, 1)},
            "device_us": {"base": round(dev_b, 1), "new": round(dev_n, 1)}, "by_name": rows[:20]}


def profile_pair(base: Callable[[], Any], new: Callable[[], Any], calls: int = 3) -> Dict[str, Any]:
    """Device work per call of two runs of a model (torch.profiler, each alone) and their host
    time (median of ``do_bench``'s host probe: 5 calls, the GPU idle before each), compared by
    :func:`explain_difference`."""
    import statistics

    import torch
    from torch.profiler import ProfilerActivity, profile

    from .bench import _probe_host_us
    from .region import region

    totals = []
    with region("inspect:round-trip-profile"):
        hosts = [statistics.median(_probe_host_us(torch, fn, None)) for fn in (base, new)]
        for fn in (base, new):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize()
            totals.append(device_totals(trace_events(prof), calls))
    return explain_difference(totals[0], totals[1], hosts[0], hosts[1])


def trace_events(prof: Any) -> List[Dict[str, Any]]:
    """The events of a finished torch.profiler run, through its chrome-trace export."""
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "trace.json")
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            return list(json.load(f).get("traceEvents", []))


def capture_problem(path: str, problem: Any, mode: str, iterations: int, restitch: bool) -> Dict[str, Any]:
    import torch
    import torch._inductor.config as icfg
    from torch._inductor.utils import run_and_get_code
    from torch.profiler import ProfilerActivity, profile, record_function

    if not torch.cuda.is_available():
        raise CaptureError(f"{path}: no CUDA GPU visible (kforge inspect profiles on a GPU)")
    dev = torch.device("cuda")
    icfg.fx_graph_cache = False  # wrapper modules must be generated (and loaded) in this process
    result: Dict[str, Any] = {"mode": mode}
    model, compiled, inputs = _compile(problem, mode, dev)
    # Replay: each Triton launch's arguments before and after it ran, once per kernel, recorded in
    # the first call (with CUDA graphs: the warm-up, which runs the wrapper eagerly; a later call
    # records the graph, where copies would be allocations in its pool). Copies go to host memory.
    recorded: Dict[str, Dict[str, Any]] = {}
    restore: List[Tuple[Any, Any]] = []

    def record_launches(mod: Any) -> None:
        for name, obj in _triton_globals(mod).items():
            orig = obj.run

            def run(*args: Any, _orig: Any = orig, _name: str = name, **kw: Any) -> Any:
                if _name in recorded or torch.cuda.is_current_stream_capturing():
                    return _orig(*args, **kw)
                before = _to_host(args)
                r = _orig(*args, **kw)
                recorded[_name] = {"before": before, "after": _to_host(args), "kwargs": kw, "run": _orig}
                return r

            obj.run = run
            restore.append((obj, orig))

    with torch.no_grad():
        ref = model(*[clone_all([x])[0] for x in inputs])
        with _WrapperHook(record_launches) as hook:
            try:
                out, codes = run_and_get_code(compiled, *inputs)
                out = clone_output(out)
            except Exception as e:
                raise CaptureError(f"{path}: torch.compile(mode={mode!r}) failed: {type(e).__name__}: {e}") from e
        torch.cuda.synchronize()
        for obj, orig in restore:
            obj.run = orig
        result["wrappers"] = list(codes)
        result["check"] = {"max_abs_diff_vs_eager": _max_abs_diff(out, ref)}

        replay = []
        for name, rec in recorded.items():
            before, after = _to_device_all(rec["before"], dev), _to_device_all(rec["after"], dev)
            args = _to_device_all(before, dev)
            kw = dict(rec["kwargs"])
            if "stream" in kw:
                kw["stream"] = torch.cuda.current_stream().cuda_stream
            try:
                rec["run"](*args, **kw)
                torch.cuda.synchronize()
                diff = _max_abs_diff(args, after)
                ms = _time_ms(lambda: rec["run"](*_to_device_all(before, dev), **kw))
                replay.append({"kernel": name, "ok": _identical(args, after), "max_abs_diff": diff, "time_ms_with_arg_copy": ms})
            except Exception as e:
                replay.append({"kernel": name, "ok": False, "error": f"{type(e).__name__}: {e}"})
        result["replay"] = replay

        for _ in range(3):
            compiled(*inputs)
        torch.cuda.synchronize()
        from .region import region

        # Exclusive when run as a kforge job (`kforge inspect --daemon`); a no-op otherwise.
        with region("inspect:profile"), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(iterations):
                with record_function(f"kforge_iter_{i}"):
                    compiled(*inputs)
                torch.cuda.synchronize()
        result["iterations"] = group_iterations(trace_events(prof), iterations)

        if restitch:
            try:
                result["restitch"] = restitch_round_trip(path, problem, mode, dev, out)
            except Exception as e:  # the inventory, replay and profile stand without it
                result["restitch"] = {"error": f"{type(e).__name__}: {e}", "identical": None, "ratio": None,
                                      "within_noise": None, "per_round": []}
    return result


#: torch.compile modes that record CUDA graphs (cudagraph trees).
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def pin_config(new: Any, old: Any) -> Optional[str]:
    """Restrict a freshly compiled kernel to the launch configuration ``old`` autotuned to
    (rebuilding its launchers from that one config), so that its first call does not autotune
    again — which would pick configurations freely and, during CUDA-graph recording, crash.
    Uses Inductor's CachingAutotuner internals; returns None when pinned, else why not — ``new``
    is left as it was unless the reason starts with "half-pinned" (then compile it again)."""
    launchers = getattr(old, "launchers", None)
    if not launchers:
        return "the original has no launcher (never ran)"
    if len(launchers) != 1:
        return f"the original has {len(launchers)} launchers (not autotuned to one)"
    try:
        load_function(new)
    except Exception as e:
        return f"the kernel's Triton function could not be reloaded: {type(e).__name__}: {e}"
    try:
        result = new._precompile_config(launchers[0].config)
    except (AttributeError, IndexError, TypeError) as e:
        return f"Inductor internals differ: {type(e).__name__}: {e}"
    except Exception as e:  # a Triton compile error, out of resources: nothing changed yet
        return f"compiling the configuration failed: {type(e).__name__}: {e}"
    try:
        new.compile_results = [result]
        new.launchers = []
        new._make_launchers()
    except Exception as e:
        return f"half-pinned, discard it: {type(e).__name__}: {e}"
    n = len(getattr(new, "launchers", []))
    return None if n == 1 else f"half-pinned, discard it: {n} launchers after pinning"


def load_function(kernel: Any) -> None:
    """Make sure a CachingAutotuner has its Triton function: one compiled in Inductor's worker
    processes comes back without it (``fn.fn`` is None after unpickling) and compiling a
    configuration in this process needs it. Inductor reloads it from the source the same way
    (``_reload_kernel``) before its own in-process compiles."""
    fn = getattr(kernel, "fn", None)
    if fn is None or getattr(fn, "fn", True) is not None:
        return
    reload = getattr(kernel, "_reload_kernel", None)
    if not callable(reload):
        raise AttributeError("the kernel came from a compile worker without its function and cannot reload it")
    kernel.fn = reload().fn


def launcher_kinds(kernels: Sequence[Any]) -> Dict[str, int]:
    """How many of these kernels launch through Inductor's static launcher, and how many through
    Triton's own (generated) one — which costs more host time per launch: a replacement that
    launches the other way than its original times that, not its kernel."""
    kinds: Dict[str, int] = {"static": 0, "triton": 0, "none": 0}
    for k in kernels:
        ls = getattr(k, "launchers", None) or []
        kinds["none" if not ls else "static" if getattr(ls[0], "_is_static", False) else "triton"] += 1
    return kinds


def compile_kernel(name: str, source: str) -> Any:
    """Compile an Inductor kernel module source the way the wrapper does (a fresh
    ``AsyncCompile``: generated wrappers ``del async_compile`` once their kernels are loaded)."""
    from torch._inductor.async_compile import AsyncCompile

    k = AsyncCompile().triton(name, source, device_str="cuda")
    return k.result() if hasattr(k, "result") else k


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

    base_model, base, inputs = _compile(problem, mode, dev)
    with torch.no_grad():
        with _WrapperHook() as base_hook:
            base_out = clone_output(base(*inputs))
        # The baseline's kernels, autotuned by that first call: under CUDA graphs a replacement
        # whose source the baseline also has runs the baseline's configuration. Kernels autotuned
        # at their first call choose again in every compile (two compiles of one model differed by
        # up to 12 % on the H200): pinned to the second compile's own choice, the comparison with
        # the baseline would time that, not the swap.
        base_by_source: Dict[str, Any] = {}
        for bm in base_hook.modules:
            bsrc = kernel_sources(_read(bm.__file__))
            for name, k in _triton_globals(bm).items():
                if name in bsrc:
                    base_by_source[bsrc[name]] = k
        _model, compiled, inputs2 = _compile(problem, mode, dev, second=True)
        with _WrapperHook(private_from=base_hook.modules) as hook:
            # This compile's own output is the reference: a fresh compile may autotune another
            # configuration (another reduction order) than the first one did.
            fresh = clone_output(compiled(*inputs2))
        to_baseline = 0
        unpinned: Dict[str, str] = {}
        not_swapped: List[str] = []
        pairs: List[Tuple[Any, str, Any, Any]] = []
        found = [(mod, name, old, src) for mod in hook.modules for src_map in [kernel_sources(_read(mod.__file__))]
                 for name, old in _triton_globals(mod).items() for src in [src_map.get(name)] if src is not None]
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
                timing = interleaved_ratio(lambda: _round_ms(a, b))
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
    identical_to = "second compile" if _identical(out, fresh) else "baseline" if _identical(out, base_out) else None
    return {"kernels_replaced": len(pairs), "configs_pinned": not unpinned, "pinned_to_baseline": to_baseline, "unpinned": unpinned,
            "not_replaced_unpinned": not_swapped, "identical": identical_to is not None, "identical_to": identical_to,
            "max_abs_diff": _max_abs_diff(out, fresh), "max_abs_diff_to_baseline": _max_abs_diff(out, base_out),
            "identical_to_first_compile": _identical(out, expected),
            "max_abs_diff_to_first_compile": _max_abs_diff(out, expected),
            "baseline_ms": _median([r["base_ms"] for r in rounds]), "restitched_ms": _median([r["new_ms"] for r in rounds]),
            **timing}


def capture_triton(path: str, mod: Any, iterations: int) -> Dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    if not torch.cuda.is_available():
        raise CaptureError(f"{path}: no CUDA GPU visible (kforge inspect profiles on a GPU)")
    torch.manual_seed(1)
    inputs = [_to_device(x, torch.device("cuda")) for x in mod.get_inputs()]
    try:
        mod.kernel_function(*inputs)
        torch.cuda.synchronize()
    except Exception as e:
        raise CaptureError(f"{path}: kernel_function failed: {type(e).__name__}: {e}") from e
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(iterations):
            with record_function(f"kforge_iter_{i}"):
                mod.kernel_function(*inputs)
            torch.cuda.synchronize()
    return {"mode": "none", "wrappers": [], "iterations": group_iterations(trace_events(prof), iterations)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m kforge.capture", description=__doc__.split("\n\n")[0])
    ap.add_argument("source")
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", default="default", choices=MODES)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--no-restitch", action="store_true")
    a = ap.parse_args(argv)
    if a.iterations < 1:
        print(f"kforge capture: --iterations must be at least 1, got {a.iterations}", file=sys.stderr)
        return 2
    try:
        kind, mod = load_source(a.source)
        try:
            import torch
        except ImportError as e:
            raise CaptureError(f"{a.source}: torch is not importable here ({e})") from e
        if kind == "problem":
            res = capture_problem(a.source, mod, a.mode, a.iterations, not a.no_restitch)
        else:
            res = capture_triton(a.source, mod, a.iterations)
        res.update({"kforge_capture": CAPTURE_VERSION, "source": a.source, "kind": kind, "torch": torch.__version__,
                    "device": torch.cuda.get_device_name()})
        try:
            import triton

            res["triton"] = triton.__version__
        except ImportError:
            res["triton"] = None
    except CaptureError as e:
        print(f"kforge capture: {e}", file=sys.stderr)
        return 2
    with open(a.out, "w") as f:
        json.dump(finite_json(res), f, allow_nan=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
