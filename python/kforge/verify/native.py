"""Native candidates (``torch.utils.cpp_extension.load_inline`` / ``load``, CUDA C++): the
candidate's compiled extension modules, their functions, and the accounting the exploit checks
apply to them — the counterpart of ``checks.LaunchCounter`` for Triton kernels.

- :func:`native_functions` finds the extension modules the candidate holds: module objects whose
  file is a shared library outside the installed packages (torch's own ``torch._C``, NumPy's, the
  standard library's are not the candidate's), referenced from the candidate module's globals,
  from its ``ModelNew`` class or from the constructed model's attributes — or held there as one of
  their functions directly (``vector_add = ext.vector_add``). Their public functions (pybind11
  builtins) are the candidate's native kernels.
- :class:`NativeCounter` counts their calls while it is entered (``sys.setprofile``'s ``c_call``
  event: every call of the function object, whichever reference it was called through) and, in
  ``ghost`` mode, makes them no-ops: every reference found to them (the extension module's dict,
  the candidate's globals, the class and the model's attributes, closure cells, lists) is replaced
  by a stand-in that runs the real function on *copies* of its tensor arguments — only to learn
  what it returns — and returns NaN-filled tensors shaped like that (the real arguments, an
  output buffer among them, are left untouched: "the native code did nothing"). A call that
  still reaches the real function in ghost mode (a reference kforge could not replace, e.g. in a
  tuple) is counted as ``bypassed``: the ghost replay cannot conclude, and says so.

The dispatch record (``dispatch.py``) sees aten ops the C++ code calls (``at::add``,
``torch::relu``): a ``TorchDispatchMode`` applies to every dispatcher call of the thread, from
Python or C++. The ghost stand-in's own copies run with the dispatch modes off, so they are not
recorded as the candidate's.

torch is imported inside the functions that use it (the runner starts without it).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import sysconfig
import tempfile
import types
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: File name endings of a compiled extension module.
SHARED_LIBRARY = (".so", ".pyd", ".dylib")


def installed_dirs() -> Tuple[str, ...]:
    """The standard library's and the installed packages' directories: an extension module there
    (``torch._C``, NumPy's, ``math``) is the environment's, not the candidate's."""
    paths = sysconfig.get_paths()
    return tuple({os.path.realpath(paths[k]) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths})


def is_native_module(obj: Any, installed: Sequence[str]) -> bool:
    """A module object loaded from a shared library outside ``installed``."""
    if not isinstance(obj, types.ModuleType):
        return False
    f = getattr(obj, "__file__", None)
    if not isinstance(f, str) or not f.endswith(SHARED_LIBRARY):
        return False
    return not os.path.realpath(f).startswith(tuple(installed))


def held_values(candidate: Any, model: Any) -> List[Any]:
    """What the candidate holds: its module's globals, its ``ModelNew`` class's attributes (and
    its bases' in the candidate's module), the constructed model's attributes and submodules'."""
    out: List[Any] = list(vars(candidate).values())
    cls = getattr(candidate, "ModelNew", None)
    for c in getattr(cls, "__mro__", ()):
        if getattr(c, "__module__", None) == getattr(candidate, "__name__", None):
            out.extend(vars(c).values())
    mods = list(model.modules()) if hasattr(model, "modules") else [model]
    for m in mods:
        out.extend(getattr(m, "__dict__", {}).values())
    return out


def native_functions(candidate: Any, model: Any) -> List[Tuple[str, Any]]:
    """``(module.function, function)`` for every public function of the extension modules the
    candidate holds (see the module's doc), in a stable order."""
    installed = installed_dirs()
    mods: List[types.ModuleType] = []
    for v in held_values(candidate, model):
        m: Any = v
        if isinstance(v, types.BuiltinFunctionType):
            m = sys.modules.get(str(getattr(v, "__module__", "") or ""))
        if is_native_module(m, installed) and m not in mods:
            mods.append(m)
    out: List[Tuple[str, Any]] = []
    for m in mods:
        for name, f in sorted(vars(m).items()):
            if not name.startswith("_") and isinstance(f, types.BuiltinFunctionType):
                out.append((f"{m.__name__}.{name}", f))
    return out


def nan_like(x: Any) -> Any:
    """``x`` (tensors, or lists/tuples of them, nested) with every tensor replaced by a new one of
    its shape, dtype and device: NaN for floating point, the largest value for integers, ``False``
    for booleans. Other values as they are."""
    import torch

    if isinstance(x, torch.Tensor):
        if x.is_floating_point() or x.is_complex():
            return torch.full_like(x, float("nan"))
        if x.dtype == torch.bool:
            return torch.zeros_like(x)
        return torch.full_like(x, torch.iinfo(x.dtype).max)
    if isinstance(x, (list, tuple)):
        return type(x)(nan_like(e) for e in x)
    return x


def copies(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (list, tuple)):
        return type(x)(copies(e) for e in x)
    return x


class NativeCounter:
    """Counts calls of the candidate's native functions while entered; ``ghost`` (set before
    entering) makes them no-ops that return NaN-filled outputs of the real outputs' shapes.
    ``calls`` by function name; ``bypassed``: ghost-mode calls that reached a real function."""

    def __init__(self, fns: Sequence[Tuple[str, Any]], ghost: bool = False) -> None:
        self.fns = list(fns)
        self.names = {id(f): n for n, f in self.fns}
        self.ghost = ghost
        self.calls: Dict[str, int] = {n: 0 for n, _ in self.fns}
        self.bypassed = 0
        self._restore: List[Tuple[Any, Any, Any]] = []
        self._profile: Optional[Any] = None
        self._inside = 0

    @property
    def count(self) -> int:
        return sum(self.calls.values())

    def stand_in(self, name: str, f: Any) -> Any:
        """A function that does not do ``f``'s work: runs ``f`` on copies (dispatch modes off) to
        learn its outputs' shapes and returns them NaN-filled."""
        import torch
        from torch.utils._python_dispatch import _disable_current_modes

        # The real function held in a tuple (which no replacement touches), not directly in a
        # closure cell or a dict: those would be among the references replaced by the stand-in.
        real = (f,)

        def ghost(*a: Any, **k: Any) -> Any:
            self.calls[name] += 1
            self._inside += 1
            try:
                with _disable_current_modes(), torch.no_grad():
                    out = real[0](*copies(list(a)), **{key: copies(v) for key, v in k.items()})
                    return nan_like(out)
            finally:
                self._inside -= 1

        return ghost

    def _replace_references(self) -> None:
        """Every reference to a native function in a dict, list or closure cell → its stand-in."""
        for name, f in self.fns:
            g = self.stand_in(name, f)
            for r in gc.get_referrers(f):
                if r is self.fns or r is self.__dict__ or r is self._restore:
                    continue
                if isinstance(r, dict):
                    for key, v in list(r.items()):
                        if v is f:
                            r[key] = g
                            self._restore.append((r, key, f))
                elif isinstance(r, list):
                    for i, v in enumerate(r):
                        if v is f:
                            r[i] = g
                            self._restore.append((r, i, f))
                elif isinstance(r, types.CellType):
                    r.cell_contents = g
                    self._restore.append((r, None, f))

    def __enter__(self) -> "NativeCounter":
        if not self.fns:
            return self
        if self.ghost:
            self._replace_references()
        ids = self.names
        previous = sys.getprofile()

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "c_call" and id(arg) in ids and not self._inside:
                # A real native function called: counted (in ghost mode, a reference missed).
                if self.ghost:
                    self.bypassed += 1
                else:
                    self.calls[ids[id(arg)]] += 1
            if previous is not None:
                previous(frame, event, arg)  # type: ignore[arg-type]

        self._profile = previous
        sys.setprofile(profile)
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.fns:
            return
        sys.setprofile(self._profile)
        for container, key, f in reversed(self._restore):
            if isinstance(container, types.CellType):
                container.cell_contents = f
            else:
                container[key] = f
        self._restore = []


#: A kernel name of torch's ``torch.cuda._sleep`` (the marker launched on the current stream).
MARKER_KERNEL = "spin_kernel"


def kernel_streams(fn: Any) -> Dict[str, Any]:
    """Run ``fn()`` under ``torch.profiler`` (CUDA activity) and say on which streams its kernels
    ran: ``current_stream`` (the profiler's id of PyTorch's current stream, learned from a marker
    kernel launched there first), ``kernels`` (name and stream of each, first 20) and
    ``off_stream`` (those not on the current stream: work a timer or a reader on the current
    stream does not wait for). ``{"error": ...}`` when the profiler could not tell."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            torch.cuda._sleep(1000)  # type: ignore[no-untyped-call]
            fn()
            torch.cuda.synchronize()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                trace = json.load(f)
    except Exception as e:  # no CUPTI here: the output comparison alone decides
        return {"error": f"torch.profiler: {type(e).__name__}: {e}"}
    return streams_of(trace)


def streams_of(trace: Any) -> Dict[str, Any]:
    """:func:`kernel_streams`'s answer from a Chrome trace (``torch.profiler``'s export): the
    kernels (``"cat": "kernel"``) in time order, the marker's stream as the current one."""
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    kernels: List[Dict[str, Any]] = [{"name": str(e.get("name", "?"))[:120], "stream": (e.get("args") or {}).get("stream")}
                                     for e in sorted((e for e in events if isinstance(e, dict) and e.get("cat") == "kernel"),
                                                     key=lambda e: float(e.get("ts", 0)))]
    marker = [k["stream"] for k in kernels if MARKER_KERNEL in str(k["name"])]
    if not marker:
        return {"error": "torch.profiler recorded no kernel of the marker (CUPTI unavailable?)", "kernels": kernels[:20]}
    ours = [k for k in kernels if MARKER_KERNEL not in str(k["name"])]
    return {"current_stream": marker[0], "kernels": ours[:20], "off_stream": [k for k in ours if k["stream"] != marker[0]][:20]}
