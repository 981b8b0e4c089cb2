"""Hooks into the code Inductor generates for a ``torch.compile``d model: its wrapper modules
(caught as they are loaded), their Triton kernels (sources, objects, launch configurations), and
kernels compiled again from their sources. Used by the capture (``kforge inspect``) and by
replacement-kernel candidates (``kforge verify --kernel``).

Inductor internals differ between torch releases: every use of one says which it relies on.
torch is imported inside the functions that use it (the capture's entry point must start without
torch, to report its absence).
"""

from __future__ import annotations

import ast
import importlib.util
import types
from typing import Any, Callable, Dict, List, Optional, Sequence


class CaptureError(Exception):
    """An input that cannot be inspected; the message names the file and the cause."""


#: torch.compile modes that record CUDA graphs (cudagraph trees).
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


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


class WrapperHook:
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

    def __enter__(self) -> "WrapperHook":
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


def private_copy(mod: Any) -> Any:
    """The module ``mod`` loaded again from its file, as a new module object with its own globals
    (its kernels are looked up there: replacing one does not touch ``mod``); attributes set on
    ``mod`` after it ran (Inductor's constants) are carried over."""
    spec = importlib.util.spec_from_file_location(f"{mod.__name__}_kforge_private", mod.__file__)
    if spec is None or spec.loader is None:
        raise CaptureError(f"cannot load {mod.__file__} again")
    new = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(new)
    for k, v in vars(mod).items():
        if k not in vars(new):
            setattr(new, k, v)
    return new


def triton_globals(mod: Any) -> Dict[str, Any]:
    return {n: o for n, o in vars(mod).items() if n.startswith("triton_") and hasattr(o, "run") and hasattr(o, "fn")}


def own_code_class(cls: Any) -> Any:
    """A subclass of model class ``cls`` whose ``forward`` is a copy on a new code object. Dynamo
    caches compiled code per code object: two torch.compile'd models of one class may share a
    cache entry (then one runs the other's code), and entries on one code object are tried in
    turn (the later one pays for the earlier one's guards) — a compile of this class has its own."""
    f = cls.forward
    fwd = types.FunctionType(f.__code__.replace(), f.__globals__, f.__name__, f.__defaults__, f.__closure__)
    return type(f"{cls.__name__}_kforge_own_code", (cls,), {"forward": fwd})


def compile_kernel(name: str, source: str) -> Any:
    """Compile an Inductor kernel module source the way the wrapper does (a fresh
    ``AsyncCompile``: generated wrappers ``del async_compile`` once their kernels are loaded)."""
    from torch._inductor.async_compile import AsyncCompile

    k = AsyncCompile().triton(name, source, device_str="cuda")
    return k.result() if hasattr(k, "result") else k


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
