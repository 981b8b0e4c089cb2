"""What the verify and inspect harnesses share: problem inputs, copies, comparison, check
records, thread accounting, timing statistics and JSON.

The bottom of the package: imports nothing from the rest of kforge (``kforge.verify`` and
``kforge.inspect`` build on it; the public client does not use it).

torch is imported inside the functions that use it, not at the top: the entry points
(``kforge.verify.runner``, ``kforge.inspect.capture``) import this module before they check
that torch is importable, and say so (exit status 2) when it is not.
"""

from __future__ import annotations

import copy
import ctypes
import importlib.util
import json
import math
import os
import signal
import statistics
import sys
import sysconfig
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

#: The input distributions of the correctness checks, in the order seeds cycle through them.
DISTRIBUTIONS = ("normal", "uniform", "heavy")
SIZES = ("default", "large")


def apply_size(mod: Any, size: str, path: str) -> None:
    """Set problem module ``mod`` (loaded from ``path``) to size preset ``size``: ``"default"``
    leaves it as written; ``"large"`` sets each key of its module-level ``LARGE`` dict as a module
    attribute, before ``get_inputs()``/``get_init_inputs()`` read them. Raises ``ValueError``
    naming the file for an unknown size, a missing or non-dict ``LARGE``, or a key that is not one
    of the module's UPPER_CASE integer constants."""
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r} (one of: {', '.join(SIZES)})")
    if size == "default":
        return
    preset = getattr(mod, size.upper(), None)
    if not isinstance(preset, dict):
        raise ValueError(f"{path}: no {size.upper()} dict, so no {size!r} size preset")
    for key, value in preset.items():
        current = getattr(mod, key, None) if isinstance(key, str) else None
        if not (isinstance(key, str) and key.isupper() and key != size.upper()
                and isinstance(current, int) and not isinstance(current, bool)):
            raise ValueError(f"{path}: {size.upper()} key {key!r} is not an UPPER_CASE integer constant of the problem")
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{path}: {size.upper()}[{key!r}] = {value!r} is not an integer")
        setattr(mod, key, value)


def strict_fp32() -> None:
    """fp32 is IEEE fp32 in every process that runs a problem: TF32 off for cuDNN (torch's own
    default is on) and for cuBLAS. Called before the problem file is imported, so a problem that
    sets TF32 itself keeps it, and before anything compiles: Inductor bakes
    ``cudnn.allow_tf32`` into its convolution templates, and the channels-last convolutions it
    picks run TF32 cuDNN kernels where eager's NCHW ones did not (level3/011's ViT on an H100:
    1.5e-3 from fp64 compiled against 8e-6 eager, 5.8e-6 compiled with this; every compile mode).
    Without torch it does nothing: the entry point says torch is missing."""
    try:
        import torch
    except ImportError:
        return
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def load_problem(path: str, size: str, tag: str) -> Any:
    """Problem file ``path`` imported as module ``kforge_<tag>_problem`` and set to size preset
    ``size`` (:func:`apply_size`), in a process set to strict fp32 first (:func:`strict_fp32`).
    ``ValueError`` naming the file for every way it is not a problem: missing, not Python,
    raising on import, without ``Model``/``get_inputs``/``get_init_inputs``, or without the
    preset."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    strict_fp32()
    spec = importlib.util.spec_from_file_location(f"kforge_{tag}_problem", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"{path}: not a Python file")
    mod = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(mod)
    except Exception as e:  # the file's own import-time failure, whatever it is
        raise ValueError(f"{path}: importing it failed: {type(e).__name__}: {e}") from e
    for name in ("Model", "get_inputs", "get_init_inputs"):
        if getattr(mod, name, None) is None:
            raise ValueError(f"{path}: not a problem file (no {name}); a KernelBench problem defines class Model, "
                             "get_inputs() and get_init_inputs()")
    apply_size(mod, size, path)
    return mod


# --- inputs and copies -------------------------------------------------------------------------


def make_inputs(problem: Any, seed: int, dist: str, dev: Any) -> List[Any]:
    """Fresh inputs: the problem's shapes and dtypes (get_inputs under `seed`), floating-point
    contents redrawn from `dist`; integer inputs (indices, labels) as the problem draws them.

    Everything is generated on ``dev``: ``get_inputs()`` runs with ``dev`` as torch's default
    device (a tensor it places explicitly elsewhere is moved), and the redrawn contents come from
    a generator on ``dev``, one floating-point input at a time, the problem's own draw of it freed
    first — at GB sizes a draw on the host and a copy over PCIe take seconds per input set, on the
    GPU milliseconds, and the peak is the inputs plus one of them."""
    import torch

    torch.manual_seed(seed)
    with torch.device(dev):
        base = list(problem.get_inputs())
    g = torch.Generator(device=dev).manual_seed(seed * 7919 + DISTRIBUTIONS.index(dist))
    out: List[Any] = []
    for i, x in enumerate(base):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            shape, dtype = x.shape, x.dtype
            base[i] = x = None  # the problem's draw, freed before the new one is made
            out.append(draw(shape, dtype, dist, g, dev))
        elif isinstance(x, torch.Tensor):
            out.append(x.to(dev))
        else:
            out.append(x)
    return out


def draw(shape: Any, dtype: Any, dist: str, g: Any, dev: Any) -> Any:
    """A contiguous tensor of ``shape`` and ``dtype`` on ``dev`` from distribution ``dist``: normal,
    uniform on [-1, 1), or heavy-tailed (a normal over a uniform, clipped to stay finite in the
    dtype), drawn in fp32 (fp64 for fp64 inputs) and rounded once to ``dtype``."""
    import torch

    work = torch.float64 if dtype == torch.float64 else torch.float32
    if dist == "normal":
        v = torch.randn(shape, generator=g, dtype=work, device=dev)
    elif dist == "uniform":
        v = torch.rand(shape, generator=g, dtype=work, device=dev).mul_(2).sub_(1)
    else:
        v = torch.randn(shape, generator=g, dtype=work, device=dev)
        v.div_(torch.rand(shape, generator=g, dtype=work, device=dev).add_(0.1)).clamp_(-50, 50)
    return v if v.dtype == dtype else v.to(dtype)


def to_device(x: Any, dev: Any) -> Any:
    """``x`` moved to ``dev`` if it is a tensor, else ``x`` itself."""
    import torch

    return x.to(dev) if isinstance(x, torch.Tensor) else x


def flat(x: Any) -> List[Any]:
    """The tensors of a model's output (a tensor, or lists/tuples of them, nested), in order."""
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in flat(e)]
    return []


def clone_output(x: Any) -> Any:
    """A copy of a model's output (tensors, or lists/tuples of them): outputs of a CUDA-graph
    replay live in the graph's memory pool and are overwritten by the next replay."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (list, tuple)):
        return type(x)(clone_output(e) for e in x)
    return x


def clone_all(xs: Sequence[Any]) -> List[Any]:
    """Copies of the tensors of ``xs``; other values as they are."""
    import torch

    return [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]


# --- comparison --------------------------------------------------------------------------------


def tolerance(policy: Dict[str, Any], dtype: Any) -> Tuple[float, float]:
    """(rtol, atol) of ``dtype`` under the policy: 1e-4 for fp32, 1e-2 otherwise, unless the policy says."""
    name = str(dtype).replace("torch.", "")
    rtol = policy.get("rtol", {}).get(name, 1e-4 if name == "float32" else 1e-2)
    atol = policy.get("atol", {}).get(name, 1e-4 if name == "float32" else 1e-2)
    return float(rtol), float(atol)


#: Elements compared at a time: the comparison runs where the tensors are (on the GPU for GPU
#: outputs), in fp64, a chunk at a time, so that its temporaries stay bounded (2 x 8 bytes per
#: element of a chunk) however large the outputs.
COMPARE_CHUNK = 1 << 26


def compare(out: Any, ref: Any, policy: Dict[str, Any]) -> Dict[str, Any]:
    """allclose per output tensor with the dtype's tolerance; NaN where the reference has none fails."""
    if isinstance(out, BaseException):
        return {"ok": False, "why": f"the candidate raised {type(out).__name__}: {out}"}
    outs, refs = flat(out), flat(ref)
    if len(outs) != len(refs):
        return {"ok": False, "why": f"{len(outs)} output tensors, the reference has {len(refs)}"}
    worst = 0.0
    for o, r in zip(outs, refs):
        if o.shape != r.shape:
            return {"ok": False, "why": f"output shape {tuple(o.shape)}, reference {tuple(r.shape)}"}
        if o.dtype != r.dtype:
            return {"ok": False, "why": f"output dtype {o.dtype}, reference {r.dtype}"}
        rtol, atol = tolerance(policy, r.dtype)
        found = compare_tensor(o.detach(), r.detach().to(o.device), rtol, atol)
        if "why" in found:
            return {"ok": False, **found}
        worst = max(worst, found["max_abs_diff"])
    return {"ok": True, "max_abs_diff": worst}


def compare_tensor(o: Any, r: Any, rtol: float, atol: float) -> Dict[str, Any]:
    """One output against its reference, chunk by chunk in fp64 on their device: the largest
    absolute difference, and ``why`` when a NaN appears where the reference has none or an
    element is beyond ``atol + rtol * |ref|``."""
    import torch

    o1, r1 = o.reshape(-1), r.reshape(-1)
    worst = 0.0
    bad = False
    for i in range(0, o1.numel(), COMPARE_CHUNK):
        oc, rc = o1[i:i + COMPARE_CHUNK].double(), r1[i:i + COMPARE_CHUNK].double()
        o_nan, r_nan = torch.isnan(oc), torch.isnan(rc)
        if bool((o_nan & ~r_nan).any()) and not bool(torch.isnan(r1).any()):
            return {"why": "NaN in the output (a sentinel was never overwritten, or the kernel produced NaN)"}
        diff = (oc - rc).abs_()
        both_nan = o_nan & r_nan
        diff.masked_fill_(both_nan, 0.0)
        worst = max(worst, float(diff.nan_to_num(nan=math.inf).max()))
        limit = rc.abs().mul_(rtol).add_(atol)  # rc may be the reference itself (fp64): not in place
        infs = (torch.isinf(oc) | torch.isinf(rc)) & (oc != rc)  # inf against anything else
        bad = bad or bool((diff > limit).any()) or bool((o_nan != r_nan).any()) or bool(infs.any())
        del oc, rc, diff, limit, o_nan, r_nan, both_nan, infs
    if bad:
        return {"why": f"max abs diff {worst:.3e} beyond rtol {rtol:g} / atol {atol:g}", "max_abs_diff": worst}
    return {"max_abs_diff": worst}


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


def judge(out: Any, ref: Any, policy: Dict[str, Any], fp64: "Fp64Reference", inputs: Callable[[], Sequence[Any]]) -> Dict[str, Any]:
    """A candidate's output against the reference's: within the dtype's tolerance (``compare``),
    else — for a floating-point output that only misses the tolerance (no NaN, shape or dtype
    finding) — by the fp64 rule on the same inputs (``inputs()``, made only then): its error
    against the fp64 reference at most 10 times the fp32 reference's own. A reordered sum (a
    compiled scan, another convolution algorithm) misses 1e-4 near zero while being as
    accurate as eager; a wrong or lower-precision result fails both. The evidence names the rule
    that decided; the fp64 copy is released after use."""
    import torch

    r = compare(out, ref, policy)
    if r["ok"] or "max_abs_diff" not in r or not str(r.get("why", "")).startswith("max abs diff"):
        return r
    if not all(isinstance(t, torch.Tensor) and t.is_floating_point() for t in flat(out)):
        return r
    f = fp64_rule(fp64, out, ref, inputs())
    fp64.release()
    evidence = {k: v for k, v in f.items() if k not in ("ok", "why")}
    if f["ok"]:
        return {"ok": True, "max_abs_diff": r["max_abs_diff"], "beyond_tolerance": r["why"], **evidence}
    return {"ok": False, "why": f"{r['why']}; the fp64 rule fails too ({f.get('why') or fp64_line(f)})",
            "max_abs_diff": r["max_abs_diff"], **evidence}


def fp64_line(f: Dict[str, Any]) -> str:
    """The fp64 rule's finding in words."""
    if f.get("rule") == "fp64-exact":
        return f"relative error {f['relative_error']:.3e} > 1e-4 where the reference is exact"
    return f"error {f['d_opt']:.3e} is {f['rho']:.1f} times the fp32 reference's {f['d_ref']:.3e} against fp64 (at most 10)"


def same_values(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Every tensor of ``a`` equal to its counterpart in ``b`` bit for bit up to NaN (other
    values ``==``)."""
    import torch

    return all(same_tensor(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


def same_tensor(a: Any, b: Any) -> bool:
    """``torch.equal`` (no temporary), else equal up to NaN where both are NaN: a reference whose
    output is NaN for redrawn inputs (``log`` of a negative value) is still the same output."""
    import torch

    return bool(torch.equal(a, b)) or identical(a, b)


def max_abs_diff(a: Any, b: Any) -> float:
    """The largest absolute difference between two (nested) outputs; infinite where shapes or
    non-tensor values differ."""
    import torch

    if isinstance(a, (list, tuple)):
        return max([max_abs_diff(x, y) for x, y in zip(a, b)] or [0.0])
    if isinstance(a, torch.Tensor):
        if a.shape != b.shape:
            return float("inf")
        a1, b1 = a.detach().reshape(-1), b.detach().to(a.device).reshape(-1)
        return max([float((a1[i:i + COMPARE_CHUNK].double() - b1[i:i + COMPARE_CHUNK].double()).abs_().max())
                    for i in range(0, a1.numel(), COMPARE_CHUNK)] or [0.0])
    return 0.0 if a == b else float("inf")


def max_abs(t: Any) -> float:
    """The largest absolute value of tensor ``t`` (0 when empty), chunk by chunk in fp64."""
    t1 = t.detach().reshape(-1)
    return max([float(t1[i:i + COMPARE_CHUNK].double().abs().max()) for i in range(0, t1.numel(), COMPARE_CHUNK)] or [0.0])


def identical(a: Any, b: Any) -> bool:
    """Two (nested) outputs equal bit for bit: same shapes and dtypes, floats equal up to NaN."""
    import torch

    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        if not (isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype):
            return False
        if a.is_floating_point() or a.is_complex():
            # Bit-for-bit up to NaN: buffers with never-written (NaN) padding are equal where both are NaN.
            return bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
        return bool(torch.equal(a, b))
    return bool(a == b)


# --- check records and threads -----------------------------------------------------------------


class Check:
    """The checks of one run, in order: gate, name, passed (None: does not apply), evidence.

    With a ``progress`` file, every check is also appended to it as one JSON line as it is added,
    and ``begin`` writes which check is about to run: if the process dies or is killed midway
    (a crash, ``os._exit``, a hang past the time limit), the orchestrator still knows which
    checks passed and which stage and check were running."""

    def __init__(self, progress: Optional[str] = None) -> None:
        self.items: List[Dict[str, Any]] = []
        self.progress = progress
        self._began: Optional[Tuple[str, str, float]] = None

    def _write(self, record: Dict[str, Any]) -> None:
        if self.progress is None:
            return
        with open(self.progress, "a") as f:
            f.write(json.dumps(finite_json(record), default=str, allow_nan=False) + "\n")
            f.flush()

    def begin(self, gate: str, name: str) -> None:
        """``gate``:``name`` is about to run (the stage named if the process ends during it)."""
        self._began = (gate, name, time.perf_counter())
        self._write({"running": {"gate": gate, "name": name}})

    def add(self, gate: str, name: str, passed: Optional[bool], **evidence: Any) -> bool:
        """passed None: the check does not apply here (reason in evidence). A check added after
        its ``begin`` gets the seconds in between as ``evidence["seconds"]``."""
        evidence.pop("ok", None)
        if self._began is not None and self._began[:2] == (gate, name):
            evidence.setdefault("seconds", round(time.perf_counter() - self._began[2], 3))
        item = {"gate": gate, "name": name, "ok": passed, "evidence": evidence}
        self.items.append(item)
        self._write({"check": item})
        mark = "n/a" if passed is None else ("ok" if passed else "FAILED")
        print(f"  {gate:<12} {name:<40} {mark}", file=sys.stderr, flush=True)
        return bool(passed) or passed is None


#: Packages whose own threads are not the candidate's: a Python thread whose ``start()`` was
#: called from code in one of these packages (torch's Inductor compile pool and its
#: ``subproc_worker_timer``, Triton's compile warm-up pool, DataLoader pin-memory threads, …) is
#: left out of the thread checks. What started a thread is the first frame of the stack at
#: ``Thread.start`` outside the standard library (``threading``, ``concurrent.futures``, …),
#: judged by its file: under the package's own directory. A thread started by candidate code
#: (directly, through an executor, or through names built at run time) is the candidate's.
ALLOWED_THREAD_ORIGINS = ("torch", "triton")

_origins: "weakref.WeakKeyDictionary[threading.Thread, str]" = weakref.WeakKeyDictionary()
_original_start: List[Any] = []


def _stdlib_dirs() -> Tuple[str, Tuple[str, ...]]:
    paths = sysconfig.get_paths()
    site = tuple({os.path.realpath(paths[k]) + os.sep for k in ("purelib", "platlib") if k in paths})
    return os.path.realpath(paths["stdlib"]) + os.sep, site


def _third_party(fn: str, site: Tuple[str, ...]) -> bool:
    """Whether ``fn`` is an installed package's file other than an allow-listed one's."""
    for d in site:
        if fn.startswith(d):
            return fn[len(d):].split(os.sep, 1)[0] not in ALLOWED_THREAD_ORIGINS
    return False


def _starter_file(frame: Any) -> str:
    """The file of the first frame outside the standard library, this module and installed
    third-party packages: a thread a library starts (tqdm's monitor, for a progress bar Inductor
    draws) is its caller's — torch's when torch called it, the candidate's when the candidate did."""
    std, site = _stdlib_dirs()
    here = os.path.realpath(__file__)
    while frame is not None:
        fn = os.path.realpath(frame.f_code.co_filename)
        stdlib = fn.startswith(std) and not any(fn.startswith(d) for d in site)
        if fn != here and not stdlib and not fn.startswith("<frozen") and not _third_party(fn, site):
            return f"{fn}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def record_thread_origins() -> None:
    """From now on every ``threading.Thread.start`` records what started the thread (see
    ``ALLOWED_THREAD_ORIGINS``). Installed by the runner before the candidate is imported."""
    if _original_start:
        return
    orig = threading.Thread.start
    _original_start.append(orig)

    def start(self: threading.Thread) -> None:
        try:
            _origins[self] = _starter_file(sys._getframe(1))
        except Exception:
            pass
        orig(self)

    threading.Thread.start = start  # type: ignore[method-assign]


def package_dirs(names: Optional[Sequence[str]] = None) -> Dict[str, str]:
    """The directories of the (imported) packages named (default ``ALLOWED_THREAD_ORIGINS``), by name."""
    out: Dict[str, str] = {}
    for n in ALLOWED_THREAD_ORIGINS if names is None else names:
        mod = sys.modules.get(n)
        f = getattr(mod, "__file__", None)
        if f:
            out[n] = os.path.realpath(os.path.dirname(f)) + os.sep
    return out


def thread_origin(t: threading.Thread) -> str:
    """What started ``t``: ``file:line`` recorded at ``start()``; for a thread started before the
    record was installed, the file of its target (or of its class, for a subclass)."""
    o = _origins.get(t)
    if o is not None:
        return o
    target = getattr(t, "_target", None)
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    if code is not None:
        return os.path.realpath(str(code.co_filename))
    return os.path.realpath(str(getattr(sys.modules.get(type(t).__module__), "__file__", None) or "?"))


def allowed_origin(origin: str, dirs: Dict[str, str]) -> Optional[str]:
    """The allow-listed package whose code ``origin`` (a ``file[:line]``) is, or None."""
    for name, d in dirs.items():
        if origin.startswith(d):
            return name
    return None


def die_with_parent() -> None:
    """``prctl(PR_SET_PDEATHSIG, SIGKILL)`` where there is one (Linux): this process is killed
    when its parent dies (a compile worker of a measure step, a warm worker's forked job)."""
    _prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def become_subreaper() -> None:
    """``prctl(PR_SET_CHILD_SUBREAPER, 1)`` where there is one: processes that the children of
    this one leave behind are orphaned to it (not to init), so that it can end them."""
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER


def _prctl(option: int, arg: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def task_ids() -> List[str]:
    """This process's thread ids from ``/proc/self/task``, sorted; empty where /proc is not
    there. The kernel cuts a task listing short when the thread it has just listed exits, so one
    read can miss live threads; the listing is read until two reads agree (at most 8 more reads,
    then the union of them all)."""
    def read() -> Optional[List[str]]:
        try:
            return sorted(os.listdir("/proc/self/task"))
        except OSError:
            return None
    last = read()
    union = set(last or [])
    for _ in range(8):
        now = read()
        if now == last:
            return last or []
        union.update(now or [])
        last = now
    return sorted(union)


def native_threads() -> Dict[int, str]:
    """This process's threads as the kernel lists them (``/proc/self/task/*/comm``): native
    threads too (OpenMP, CUDA, C++ ``std::thread``). Empty where /proc is not there."""
    out: Dict[int, str] = {}
    for tid in task_ids():
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                out[int(tid)] = f.read().strip()
        except (OSError, ValueError):
            continue
    return out


def thread_check(ck: Check, name: str, before: Set[Any], harness_compiles: bool, gate: str = "exploits",
                 native_before: Optional[Dict[int, str]] = None) -> None:
    """Fails when a Python thread started since ``before`` by anything but an allow-listed package
    (``ALLOWED_THREAD_ORIGINS``) is alive. Every new thread is in the evidence with its origin;
    native threads new since ``native_before`` are listed (by kernel name) but not judged: the
    OpenMP, CUDA and driver threads torch starts lazily carry the process's own name, so a name
    does not tell whose they are. Where the harness itself compiled meanwhile (``--kernel``),
    the threads of Inductor's compile pool are torch's as well (also found by the pool object)."""
    started = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    own = harness_threads() if harness_compiles else set()
    dirs = package_dirs()
    threads = []
    foreign = []
    for t in started:
        origin = thread_origin(t)
        pkg = "torch" if t in own else allowed_origin(origin, dirs)
        threads.append({"name": t.name, "origin": origin, "allowed": pkg})
        if pkg is None:
            foreign.append(t)
    native: List[str] = []
    if native_before is not None:
        native = sorted(n for tid, n in native_threads().items() if tid not in native_before)
    ck.add(gate, name, not foreign, before=len(before), after=len(before) + len(started),
           started=[t.name for t in foreign], harness=[d["name"] for d in threads if d["allowed"]],
           threads=threads, native_started=native, allowed_origins=list(ALLOWED_THREAD_ORIGINS))


def harness_threads() -> Set[Any]:
    """Threads torch.compile itself runs (Inductor's compile pool grows a worker per concurrent
    compile, lazily): not the candidate's, even when a compile in the harness starts them late."""
    own: Set[Any] = set()
    ac = sys.modules.get("torch._inductor.async_compile")
    try:
        pool = ac.AsyncCompile.pool() if ac is not None else None
        own |= set(getattr(pool, "_threads", ()) or ())
    except Exception:
        pass
    for t in threading.enumerate():
        mod = getattr(getattr(t, "_target", None), "__module__", "") or ""
        if mod.startswith("torch."):
            own.add(t)
    return own


# --- timing statistics and JSON ----------------------------------------------------------------

# Two-sided 95 % t quantiles by degrees of freedom (1..10; beyond: 1.96 is close enough).
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228]


#: Counted timing rounds a step (a dispatch measurement, verify's performance gate) times again
#: because their region was not exclusive (tainted: a sibling's drain timed out, or was skipped
#: while the sibling still finished slow GPU work, or an unmanaged process used the GPU). Past
#: these, a tainted round is kept and counted.
TAINTED_RETAKES = 2


def retake_tainted(regions: Sequence[Any], taint: Dict[str, int], room: bool = True) -> Optional[str]:
    """What becomes of a counted round timed in these exited regions
    (``do_bench_interleaved(regions=...)``): ``None`` when none was tainted; ``"retaken"`` (time
    it again) while fewer than ``TAINTED_RETAKES`` were and there is ``room`` for another round;
    else ``"kept"``. Counted in ``taint`` under that word."""
    taint.setdefault("retaken", 0)
    taint.setdefault("kept", 0)
    if not any(getattr(r, "tainted", False) for r in regions):
        return None
    fate = "retaken" if taint["retaken"] < TAINTED_RETAKES and room else "kept"
    taint[fate] += 1
    return fate


def t95(rounds: int) -> float:
    """Student's t for a 95 % interval over ``rounds`` values (``rounds - 1`` degrees of freedom;
    beyond the table, its last entry: a slightly wider interval)."""
    return T95[min(rounds - 2, len(T95) - 1)]


def mean_half(logs: List[float]) -> Tuple[float, float]:
    """Mean of log ratios and the half-width of its 95 % t interval."""
    mean = statistics.fmean(logs)
    sd = statistics.stdev(logs) if len(logs) > 1 else 0.0
    return mean, t95(len(logs)) * sd / math.sqrt(len(logs))


def noise_floor(noise: List[float]) -> float:
    """The noise floor, in logs, of a baseline timed against itself over rounds (``noise``: one
    log ratio per round): the upper end of its 95 % interval, ``|mean| + half``. A ratio is
    beyond noise when its interval clears it. Infinite with fewer than two rounds (no interval)."""
    if len(noise) < 2:
        return math.inf
    mean, half = mean_half(noise)
    return abs(mean) + half


#: The standard error of a median of n samples of spread sd, over sd/sqrt(n) (normal samples).
MEDIAN_SE = math.sqrt(math.pi / 2)


def paired_log(base: Sequence[float], other: Sequence[float]) -> float:
    """The median of the calls' log ratios other/base, call i with call i: the two sides' calls
    alternate in one region, so call i of each ran seconds apart at most and a drift of the
    machine (a slower host for a second, a clock step) falls on both. The ratio of the two
    medians does not cancel it: a round whose calls split between two host speeds has a median
    anywhere between them (the unrolled LSTM at the large preset, session 31: 3.2 and 7.3 ms
    within one round, all three sides alike)."""
    n = min(len(base), len(other))
    return statistics.median(math.log(other[i] / base[i]) for i in range(n))


def paired_round(samples: Sequence[Sequence[float]]) -> List[float]:
    """One round of functions timed call by call in turn, the first the baseline: the baseline's
    median, and for each other function that median times its paired ratio to the baseline
    (``exp(paired_log(baseline, other))``). A ratio of an entry to the baseline's is then the
    paired one, what every consumer of a round's (baseline, other, baseline again) rows computes:
    verify's performance gate, the dispatch and config agents' choices. Ratios between two
    non-baseline entries are differences of paired logs."""
    base = samples[0]
    m = statistics.median(base)
    return [m] + [m * math.exp(paired_log(base, xs)) for xs in samples[1:]]


def pair_spread(a: Sequence[float], b: Sequence[float], c: Sequence[float]) -> float:
    """The larger standard deviation of the calls' log ratios new/base and base-again/base (0
    under two calls): what a round's median of them wanders by, times MEDIAN_SE / sqrt(calls)."""
    n = min(len(a), len(b), len(c))
    if n < 2:
        return 0.0
    return max(statistics.stdev(math.log(y[i] / a[i]) for i in range(n)) for y in (b, c))


def finite_json(x: Any) -> Any:
    """JSON has no NaN or infinity: such floats become the strings "nan", "inf", "-inf"."""
    if isinstance(x, float) and not (x == x and abs(x) != float("inf")):
        return "nan" if x != x else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): finite_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_json(v) for v in x]
    return x
