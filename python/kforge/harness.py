"""What the verify and inspect harnesses share: problem inputs, copies, comparison, check
records, thread accounting, timing statistics and JSON.

The bottom of the package: imports nothing from the rest of kforge (``kforge.verify`` and
``kforge.inspect`` build on it; the public client does not use it).

torch is imported inside the functions that use it, not at the top: the entry points
(``kforge.verify.runner``, ``kforge.inspect.capture``) import this module before they check
that torch is importable, and say so (exit status 2) when it is not.
"""

from __future__ import annotations

import math
import statistics
import sys
import threading
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

#: The input distributions of the correctness checks, in the order seeds cycle through them.
DISTRIBUTIONS = ("normal", "uniform", "heavy")

# --- inputs and copies -------------------------------------------------------------------------


def make_inputs(problem: Any, seed: int, dist: str, dev: Any) -> List[Any]:
    """Fresh inputs: the problem's shapes and dtypes (get_inputs under `seed`), floating-point
    contents redrawn from `dist`; integer inputs (indices, labels) as the problem draws them."""
    import torch

    torch.manual_seed(seed)
    base = problem.get_inputs()
    g = torch.Generator().manual_seed(seed * 7919 + DISTRIBUTIONS.index(dist))
    out: List[Any] = []
    for x in base:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            shape = x.shape
            if dist == "normal":
                v = torch.randn(shape, generator=g, dtype=torch.float64)
            elif dist == "uniform":
                v = torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1
            else:  # heavy-tailed: normal over a uniform, clipped to stay finite in the dtype
                v = torch.randn(shape, generator=g, dtype=torch.float64) / (torch.rand(shape, generator=g, dtype=torch.float64) + 0.1)
                v = v.clamp(-50, 50)
            out.append(v.to(dtype=x.dtype, device=dev).contiguous())
        elif isinstance(x, torch.Tensor):
            out.append(x.to(dev))
        else:
            out.append(x)
    return out


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


def compare(out: Any, ref: Any, policy: Dict[str, Any]) -> Dict[str, Any]:
    """allclose per output tensor with the dtype's tolerance; NaN where the reference has none fails."""
    import torch

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
        o64, r64 = o.detach().double().cpu(), r.detach().double().cpu()
        if bool(torch.isnan(o64).any()) and not bool(torch.isnan(r64).any()):
            return {"ok": False, "why": "NaN in the output (a sentinel was never overwritten, or the kernel produced NaN)"}
        if o.numel():
            diff = (o64 - r64).abs()
            worst = max(worst, float(diff.max()))
            if not bool(torch.allclose(o64, r64, rtol=rtol, atol=atol, equal_nan=True)):
                return {"ok": False, "why": f"max abs diff {float(diff.max()):.3e} beyond rtol {rtol:g} / atol {atol:g}", "max_abs_diff": float(diff.max())}
    return {"ok": True, "max_abs_diff": worst}


def same_values(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Every tensor of ``a`` equal to its counterpart in ``b`` (other values ``==``)."""
    import torch

    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


def max_abs_diff(a: Any, b: Any) -> float:
    """The largest absolute difference between two (nested) outputs; infinite where shapes or
    non-tensor values differ."""
    import torch

    if isinstance(a, (list, tuple)):
        return max([max_abs_diff(x, y) for x, y in zip(a, b)] or [0.0])
    if isinstance(a, torch.Tensor):
        if a.shape != b.shape:
            return float("inf")
        if a.numel() == 0:
            return 0.0
        return float((a.double() - b.double()).abs().max().item())
    return 0.0 if a == b else float("inf")


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
    """The checks of one run, in order: gate, name, passed (None: does not apply), evidence."""

    def __init__(self) -> None:
        self.items: List[Dict[str, Any]] = []

    def add(self, gate: str, name: str, passed: Optional[bool], **evidence: Any) -> bool:
        """passed None: the check does not apply here (reason in evidence)."""
        evidence.pop("ok", None)
        self.items.append({"gate": gate, "name": name, "ok": passed, "evidence": evidence})
        mark = "n/a" if passed is None else ("ok" if passed else "FAILED")
        print(f"  {gate:<12} {name:<40} {mark}", file=sys.stderr, flush=True)
        return bool(passed) or passed is None


def thread_check(ck: Check, name: str, before: Set[Any], harness_compiles: bool, gate: str = "exploits") -> None:
    """Fails when a thread started since ``before`` is alive. Only where the harness itself
    compiled meanwhile (``--kernel`` mode) are torch.compile's own threads left out — otherwise a
    candidate could hide work in Inductor's pool."""
    started = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    own = harness_threads() if harness_compiles else set()
    foreign = [t for t in started if t not in own]
    ck.add(gate, name, not foreign, before=len(before), after=len(before) + len(started),
           started=[t.name for t in foreign], harness=[t.name for t in started if t in own])


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


def mean_half(logs: List[float]) -> Tuple[float, float]:
    """Mean of log ratios and the half-width of its 95 % t interval."""
    mean = statistics.fmean(logs)
    sd = statistics.stdev(logs) if len(logs) > 1 else 0.0
    return mean, T95[min(len(logs) - 2, len(T95) - 1)] * sd / math.sqrt(len(logs))


def finite_json(x: Any) -> Any:
    """JSON has no NaN or infinity: such floats become the strings "nan", "inf", "-inf"."""
    if isinstance(x, float) and not (x == x and abs(x) != float("inf")):
        return "nan" if x != x else ("inf" if x > 0 else "-inf")
    if isinstance(x, dict):
        return {str(k): finite_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_json(v) for v in x]
    return x
