"""Capture a ``torch.compile``d problem for ``kforge inspect`` (runs on a GPU).

``python3 -m kforge.inspect.capture SOURCE.py --out CAPTURE.json [--mode default] [--iterations 5]``

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
  from its own source (:mod:`.restitch`; the same CUDA-graph setting as the mode), outputs compared
  with the unmodified compiled model and both timed;
* ``roofline``: each recorded Triton kernel's least traffic (from its recorded arguments) against
  the device's bandwidth, with its device time from the profile (:mod:`.roofline`).

Bad input gives one line on stderr naming the file and the cause, and exit status 2. torch is
imported inside the functions that use it: a missing torch is such a bad input, reported so.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..bench import median_ms
from ..harness import SIZES, apply_size, clone_all, clone_output, finite_json, identical, max_abs_diff, strict_fp32, to_device
from ..region import region
from .inductor import CaptureError, WrapperHook, kernel_sources, triton_globals
from .restitch import compile_problem, restitch_round_trip
from .roofline import device_peak, peak_of, roofline, roofline_summary
from .traces import device_totals, group_iterations, trace_events

CAPTURE_VERSION = 1
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


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


def load_sized(path: str, size: str) -> Tuple[str, Any]:
    """:func:`load_source`, a problem set to size preset ``size`` (a bad preset is a
    :class:`CaptureError` naming the file); a Triton kernel file as it is. The process is set to
    strict fp32 first (``harness.strict_fp32``)."""
    strict_fp32()
    kind, mod = load_source(path)
    if kind == "problem":
        try:
            apply_size(mod, size, path)
        except ValueError as e:
            raise CaptureError(str(e)) from e
    return kind, mod


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


def _time_ms(fn: Callable[[], Any]) -> float:
    """A median over about 50 ms of calls (the round trip takes 15 of these, in regions that, on a
    shared GPU, hold every other job)."""
    return median_ms(fn, "inspect", warmup=10, rep=50, count_host=True)


def capture_roofline(codes: Sequence[str], recorded: Dict[str, Dict[str, Any]], totals: Dict[str, Dict[str, float]],
                     dev: Any) -> Dict[str, Any]:
    """Each recorded Triton kernel's least traffic against the device's bandwidth (measured here,
    in the region ``inspect:bandwidth``) and the model's roofline ceiling
    (:mod:`.roofline`); a failure is the roofline's ``why``, never the capture's."""
    try:
        found = [(None, n, None, src) for code in codes for n, src in kernel_sources(code).items()]
        sources = sorted({n for _m, n, _k, _s in found})
        rates, l2, why = device_peak(dev, "inspect:bandwidth")
        rows = roofline(found, recorded, totals, peak_of(rates), l2)
        return roofline_summary({n: t["us"] for n, t in totals.items()}, list(sources), rows, rates, l2, why)
    except Exception as e:  # advice: the inventory, replay and profile stand without it
        return {"peak_bytes_per_s": None, "kernels": {}, "ceiling": None,
                "why": f"the roofline failed: {type(e).__name__}: {str(e)[:200]}"}


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
    model, compiled, inputs = compile_problem(problem, mode, dev)
    # Replay: each Triton launch's arguments before and after it ran, once per kernel, recorded in
    # the first call (with CUDA graphs: the warm-up, which runs the wrapper eagerly; a later call
    # records the graph, where copies would be allocations in its pool). Copies go to host memory.
    recorded: Dict[str, Dict[str, Any]] = {}
    restore: List[Tuple[Any, Any]] = []

    def record_launches(mod: Any) -> None:
        for name, obj in triton_globals(mod).items():
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
        with WrapperHook(record_launches) as hook:
            try:
                out, codes = run_and_get_code(compiled, *inputs)
                out = clone_output(out)
            except Exception as e:
                raise CaptureError(f"{path}: torch.compile(mode={mode!r}) failed: {type(e).__name__}: {e}") from e
        torch.cuda.synchronize()
        for obj, orig in restore:
            obj.run = orig
        result["wrappers"] = list(codes)
        result["check"] = {"max_abs_diff_vs_eager": max_abs_diff(out, ref)}

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
                diff = max_abs_diff(args, after)
                ms = _time_ms(lambda: rec["run"](*_to_device_all(before, dev), **kw))
                replay.append({"kernel": name, "ok": identical(args, after), "max_abs_diff": diff, "time_ms_with_arg_copy": ms})
            except Exception as e:
                replay.append({"kernel": name, "ok": False, "error": f"{type(e).__name__}: {e}"})
        result["replay"] = replay

        for _ in range(3):
            compiled(*inputs)
        torch.cuda.synchronize()
        # Exclusive when run as a kforge job (`kforge inspect --daemon`); a no-op otherwise.
        with region("inspect:profile"), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(iterations):
                with record_function(f"kforge_iter_{i}"):
                    compiled(*inputs)
                torch.cuda.synchronize()
        events = trace_events(prof)
        result["iterations"] = group_iterations(events, iterations)
        result["roofline"] = capture_roofline(list(codes), recorded, device_totals(events, iterations), dev)

        if restitch:
            try:
                result["restitch"] = restitch_round_trip(path, problem, mode, dev, out)
            except Exception as e:  # the inventory, replay and profile stand without it
                result["restitch"] = {"error": f"{type(e).__name__}: {e}", "identical": None, "ratio": None,
                                      "within_noise": None, "per_round": []}
    return result


def capture_triton(path: str, mod: Any, iterations: int) -> Dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    if not torch.cuda.is_available():
        raise CaptureError(f"{path}: no CUDA GPU visible (kforge inspect profiles on a GPU)")
    torch.manual_seed(1)
    with torch.device("cuda"):  # drawn on the GPU, not drawn on the host and copied
        inputs = [to_device(x, torch.device("cuda")) for x in mod.get_inputs()]
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
    ap = argparse.ArgumentParser(prog="python3 -m kforge.inspect.capture", description=__doc__.split("\n\n")[0])
    ap.add_argument("source")
    ap.add_argument("--out", required=True)
    ap.add_argument("--mode", default="default", choices=MODES)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--no-restitch", action="store_true")
    ap.add_argument("--size", default="default", choices=SIZES, help="a problem's size preset")
    a = ap.parse_args(argv)
    if a.iterations < 1:
        print(f"kforge capture: --iterations must be at least 1, got {a.iterations}", file=sys.stderr)
        return 2
    try:
        kind, mod = load_sized(a.source, a.size)
        if kind != "problem" and a.size != "default":
            raise CaptureError(f"{a.source}: --size {a.size} applies to a problem, not a Triton kernel file")
        try:
            import torch
        except ImportError as e:
            raise CaptureError(f"{a.source}: torch is not importable here ({e})") from e
        if kind == "problem":
            res = capture_problem(a.source, mod, a.mode, a.iterations, not a.no_restitch)
        else:
            res = capture_triton(a.source, mod, a.iterations)
        res.update({"kforge_capture": CAPTURE_VERSION, "source": a.source, "kind": kind, "size": a.size, "torch": torch.__version__,
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
