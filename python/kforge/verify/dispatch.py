"""The run-time record of the aten ops a candidate's forward dispatches (``kforge verify``'s
``dispatch`` gate): the defense against torch compute that does not depend on how a call was
spelled (``getattr`` with a built name, ``importlib``, ``eval``, an object the static gate cannot
see).

Around every call of the candidate's forward in the runtime checks, :class:`DispatchRecord` holds
a ``TorchDispatchMode`` (every aten op that reaches the dispatcher, after autograd and after
composite ops decomposed) and a ``TorchFunctionMode`` (the torch API calls: which ops belong to an
allowed vendor call). An op is

- *vendor*: dispatched inside a call of an allowed vendor-library function (``F.linear``,
  ``torch.matmul``, ``@``, ``F.conv2d``, ``F.scaled_dot_product_attention``, … — the families of
  the reference's own calls under the ``dispatch-aware`` policy, none under ``strict-no-torch``),
  or itself an aten op of such a family (``aten::mm``, ``aten::convolution``, …), or inside a call
  the policy's ``allowed_torch_ops`` names (an aten op the policy's ``allowed_aten_ops`` names is
  allowed too, counted as ``policy_allowed``);
- *plumbing*: in :data:`PLUMBING` — allocation, constant fills, views and metadata, which compute
  nothing from the inputs;
- *layout*: a copy that keeps the dtype (:data:`LAYOUT`: ``clone``, ``copy_``, ``_to_copy`` —
  ``.contiguous()`` of a transposed weight): allowed unless the reference itself does nothing but
  plumbing and copies (a transpose or copy problem, whose work the copy is), which
  :meth:`DispatchRecord.of_reference` learns from one reference forward. A copy that changes the
  dtype is a cast, compute;
- *Triton's*: dispatched from Triton's own code (its interpreter copies arguments with torch under
  ``TRITON_INTERPRET=1``, its autotuner clears buffers). The op's caller is the innermost Python
  frame outside torch and this module; when that frame is in Triton's package, the op is Triton's,
  counted but not the candidate's. A kernel launch itself does not pass through aten dispatch.
- *compute*: anything else — the finding ``dispatch:torch-compute``, with the ops, their counts and
  where they were called from.

Limits: dispatch modes are per thread (threads are the thread-count checks' concern); a candidate
that switches the modes off is the static gate's (``harness-access``: the dispatch machinery);
work captured into a CUDA graph outside the forward (at construction) and replayed in it
dispatches nothing at replay (GPU only; not covered). ``torch.compile`` inside the forward runs
eagerly under the modes, so its ops are recorded. Dynamo marks a frame it met under the modes
"skip" (torch 2.11: "non-infra torch dispatch mode present"), and from then on never runs its
compiled code: :func:`forget_dynamo_state` clears that mark for the candidate's own code before
gate 4, which then times the compiled forward.
"""

from __future__ import annotations

import os
import sys
import types
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

#: Aten ops that compute nothing from their inputs' values: allocation, constant fills, views,
#: metadata and scalar reads. Everything else a candidate dispatches outside an allowed vendor
#: call is torch compute.
PLUMBING = frozenset({
    # allocation
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted",
    # constant fills (no input values read)
    "zeros", "zeros_like", "ones", "ones_like", "full", "full_like", "new_zeros", "new_ones", "new_full",
    "zero_", "fill_", "arange", "scalar_tensor",
    # views and metadata
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "t", "transpose", "permute", "expand",
    "expand_as", "squeeze", "unsqueeze", "slice", "select", "narrow", "unbind", "split", "split_with_sizes",
    "chunk", "diagonal", "alias", "detach", "unfold", "view_as", "view_as_real", "view_as_complex", "lift_fresh",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "_local_scalar_dense",
})

#: Copies: layout work, allowed when they keep the dtype and the reference computes more than copies.
LAYOUT = frozenset({"clone", "copy_", "_to_copy"})

#: Aten ops of each vendor family: allowed when the family is, also outside a vendor call.
VENDOR_OPS: Dict[str, frozenset[str]] = {
    "gemm": frozenset({"mm", "addmm", "bmm", "baddbmm", "addbmm", "dot", "mv", "addmv"}),
    "conv": frozenset({"convolution", "_convolution", "cudnn_convolution", "cudnn_convolution_transpose",
                       "mkldnn_convolution", "convolution_overrideable", "_slow_conv2d_forward",
                       "slow_conv3d_forward", "slow_conv_transpose2d", "slow_conv_transpose3d"}),
    "attention": frozenset({"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                            "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                            "_scaled_dot_product_fused_attention_overrideable"}),
}

#: The torch API functions of each vendor family, by name in torch, torch.nn.functional and
#: torch.Tensor (resolved to the objects a TorchFunctionMode receives).
VENDOR_FUNCTIONS: Dict[str, Tuple[str, ...]] = {
    "gemm": ("matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm", "einsum", "tensordot", "linear", "__matmul__", "__rmatmul__"),
    "conv": ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d"),
    "attention": ("scaled_dot_product_attention",),
}

#: Most call sites kept per op in the evidence.
MAX_SITES = 3


def prepare() -> None:
    """Import what the dispatch modes import on first use (torch's modes are wrapped to disable
    Dynamo, and importing Dynamo wraps ``torch.manual_seed``): called before the harness takes the
    identities of torch's functions and the threads alive, so the record changes neither."""
    import torch._dynamo  # noqa: F401


def package_dir(mod: Any) -> str:
    return os.path.dirname(os.path.abspath(str(getattr(mod, "__file__", "") or ""))) + os.sep


def resolve(dotted: str) -> Optional[Any]:
    """``torch.nn.functional.relu`` or ``Tensor.matmul`` as the object, or None."""
    import torch

    parts = dotted.split(".")
    obj: Any = torch.Tensor if parts[0] == "Tensor" else torch if parts[0] == "torch" else None
    for p in parts[1:]:
        obj = getattr(obj, p, None) if obj is not None else None
    return obj


def vendor_callables(families: Sequence[str], allowed_ops: Sequence[str]) -> Dict[int, str]:
    """id of each torch callable an allowed family or ``allowed_torch_ops`` entry names -> its name."""
    import torch
    import torch.nn.functional as F

    out: Dict[int, str] = {}
    spaces = (("torch", torch), ("torch.nn.functional", F), ("Tensor", torch.Tensor), ("torch._C._nn", torch._C._nn),
              ("torch._C._VariableFunctions", torch._C._VariableFunctions), ("torch.functional", torch.functional))
    for fam in families:
        for name in VENDOR_FUNCTIONS.get(fam, ()):
            for prefix, ns in spaces:
                obj = getattr(ns, name, None)
                if obj is not None:
                    out[id(obj)] = f"{prefix}.{name}"
    for dotted in allowed_ops:
        obj = resolve(dotted)
        if obj is not None:
            out[id(obj)] = dotted
    return out


def same_dtype(op: str, args: Sequence[Any], kwargs: Dict[str, Any]) -> bool:
    """Whether a copy keeps the dtype (a cast is compute) and the device (a move off the device is
    not layout either)."""
    import torch

    src = args[0] if args else None
    if not isinstance(src, torch.Tensor):
        return False
    if op == "copy_":
        other = args[1] if len(args) > 1 else None
        return isinstance(other, torch.Tensor) and other.dtype == src.dtype and other.device == src.device
    if op == "_to_copy":
        dtype, device = kwargs.get("dtype"), kwargs.get("device")
        return (dtype is None or dtype == src.dtype) and (device is None or torch.device(device) == src.device)
    return True


class DispatchRecord:
    """Records the aten ops dispatched inside ``with record:`` (one candidate forward) and checks
    them against the policy once every call was made (:meth:`check`)."""

    def __init__(self, policy: Dict[str, Any], applies: bool = True) -> None:
        import torch

        try:
            import triton

            triton_dir = package_dir(triton)
        except ImportError:
            triton_dir = os.sep + "\0no-triton" + os.sep

        self.applies = applies
        self.torch_policy = str(policy.get("torch_policy", "dispatch-aware"))
        calls = list(policy.get("reference_vendor_calls", [])) if self.torch_policy in ("dispatch-aware", "reference-ops") else []
        self.reference_calls = calls
        self.families = sorted({str(c.get("family")) for c in calls if isinstance(c, dict)})
        self.vendor_ops: frozenset[str] = frozenset(op for f in self.families for op in VENDOR_OPS.get(f, frozenset()))
        self.callables = vendor_callables(self.families, [str(x) for x in policy.get("allowed_torch_ops", [])])
        self.allowed_aten = frozenset(str(x) for x in policy.get("allowed_aten_ops", []))
        self.skip_dirs = (package_dir(torch), os.path.abspath(__file__))
        self.triton_dir = triton_dir
        self.depth = 0
        self.counts: Dict[str, Counter[str]] = {k: Counter() for k in ("vendor", "plumbing", "layout", "triton", "reference_allowed",
                                                                     "policy_allowed", "compute")}
        self.reference_ops: Counter[str] = Counter()
        self.learning = False
        self.layout_allowed = True
        self.vendor_calls: Counter[str] = Counter()
        self.sites: Dict[str, List[str]] = {}
        self.calls = 0
        self.modes: List[Any] = []

    def caller(self) -> Tuple[str, int]:
        """The innermost Python frame outside torch and this module: who dispatched the op."""
        f: Any = sys._getframe(2)
        while f is not None:
            name = os.path.abspath(f.f_code.co_filename)
            if not (name.startswith(self.skip_dirs[0]) or name == self.skip_dirs[1]):
                return name, int(f.f_lineno)
            f = f.f_back
        return "?", 0

    def on_op(self, op: str, args: Sequence[Any], kwargs: Dict[str, Any]) -> None:
        if self.learning:
            self.reference_ops[op] += 1
            return
        if self.depth > 0 or op in self.vendor_ops:
            self.counts["vendor"][op] += 1
            return
        if op in PLUMBING:
            self.counts["plumbing"][op] += 1
            return
        if op in LAYOUT and self.layout_allowed and same_dtype(op, args, kwargs):
            self.counts["layout"][op] += 1
            return
        file, line = self.caller()
        if file.startswith(self.triton_dir):
            self.counts["triton"][op] += 1
            return
        if self.torch_policy == "reference-ops" and op in self.reference_ops:
            self.counts["reference_allowed"][op] += 1  # the reference computes with it too: allowed by the policy
            return
        if op in self.allowed_aten:
            self.counts["policy_allowed"][op] += 1  # named by the policy's allowed_aten_ops
            return
        self.counts["compute"][op] += 1
        sites = self.sites.setdefault(op, [])
        site = f"{file}:{line}"
        if site not in sites and len(sites) < MAX_SITES:
            sites.append(site)

    def __enter__(self) -> "DispatchRecord":
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode

        record = self

        class Functions(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Optional[Dict[str, Any]] = None) -> Any:
                name = record.callables.get(id(func))
                if name is None:
                    return func(*args, **(kwargs or {}))
                record.vendor_calls[name] += 1
                record.depth += 1
                try:
                    return func(*args, **(kwargs or {}))
                finally:
                    record.depth -= 1

        class Ops(TorchDispatchMode):  # type: ignore[no-untyped-call]
            def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Optional[Dict[str, Any]] = None) -> Any:
                record.on_op(str(func._schema.name).split("::")[-1], args, kwargs or {})
                return func(*args, **(kwargs or {}))

        self.calls += 1
        if self.applies:
            self.modes = [Functions(), Ops()]  # type: ignore[no-untyped-call]
            for m in self.modes:
                m.__enter__()
        return self

    def of_reference(self) -> "DispatchRecord":
        """``with record.of_reference(): ref_model(*xs)``: learns what the reference dispatches
        (no finding); when that is nothing but plumbing and copies, copies are the work."""
        self.learning = True
        self.calls -= 1  # not one of the candidate's forwards
        return self

    def __exit__(self, *exc: Any) -> None:
        for m in reversed(self.modes):
            m.__exit__(None, None, None)
        self.modes = []
        if self.learning:
            self.learning = False
            self.layout_allowed = any(op not in PLUMBING and op not in LAYOUT for op in self.reference_ops)

    def evidence(self) -> Dict[str, Any]:
        return {"torch_policy": self.torch_policy, "allowed_families": self.families,
                "reference_vendor_calls": self.reference_calls, "forward_calls": self.calls,
                "reference_ops": dict(self.reference_ops), "layout_copies_allowed": self.layout_allowed,
                "vendor_calls": dict(self.vendor_calls),
                **{f"{k}_ops": dict(v) for k, v in self.counts.items()}, "compute_sites": self.sites}

    def check(self, ck: Any) -> None:
        """Add ``dispatch:torch-compute`` to the checks: failed when any op was torch compute."""
        if not self.applies:
            ck.add("dispatch", "torch-compute", None,
                   note="a replacement kernel is one Triton kernel inside the compiled problem: the torch calls around it are Inductor's")
            return
        compute = self.counts["compute"]
        note = ("torch computed " + ", ".join(f"aten::{op} x{n}" for op, n in compute.most_common())
                + " in the candidate's forward" if compute else "")
        ck.add("dispatch", "torch-compute", not compute, note=note, **self.evidence())


def candidate_codes(module: Any, instance: Any = None) -> List[Any]:
    """The code objects a ``torch.compile`` of the candidate's can have met under the record:
    those of ``module``'s own file (functions, decorated ones through ``__wrapped__`` or Dynamo's
    ``_torchdynamo_orig_callable``, methods, properties, static and class methods, nested
    classes and nested functions), and the ``forward`` of every module class in ``instance``'s
    tree (torch's own ``nn.Linear.forward`` when the candidate compiles an ``nn.Linear``)."""
    file = getattr(module, "__file__", None)
    found: Dict[int, Any] = {}
    visited: Set[int] = set()

    def add(code: Any, any_file: bool) -> None:
        if id(code) in found or not (any_file or code.co_filename == file):
            return
        found[id(code)] = code
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                add(c, True)  # nested in it: its file

    def function(obj: Any, any_file: bool = False) -> None:
        for _ in range(16):  # through the decorators
            code = getattr(obj, "__code__", None)
            if isinstance(code, types.CodeType):
                add(code, any_file)
            inner = getattr(obj, "_torchdynamo_orig_callable", None) or getattr(obj, "__wrapped__", None)
            if inner is None or inner is obj:
                return
            obj = inner

    def visit(obj: Any) -> None:
        if id(obj) in visited:
            return
        visited.add(id(obj))
        if isinstance(obj, property):
            for f in (obj.fget, obj.fset, obj.fdel):
                function(f)
        elif isinstance(obj, (staticmethod, classmethod)):
            function(obj.__func__)
        elif isinstance(obj, type):
            if obj.__module__ == getattr(module, "__name__", None):
                for member in list(vars(obj).values()):
                    visit(member)
        else:
            function(obj)

    for obj in list(vars(module).values()):
        visit(obj)
    for m in instance.modules() if hasattr(instance, "modules") else ():
        function(getattr(type(m), "forward", None), any_file=True)
    return list(found.values())


def forget_dynamo_state(module: Any, instance: Any = None) -> int:
    """Reset Dynamo's per-code state (its cache and a "skip" mark) for the candidate's code
    (:func:`candidate_codes`), after the recorded calls: a ``torch.compile`` inside the forward
    compiles again on the next call, without the modes. The baseline's compiled code lives on the
    problem file's ``Model.forward``, which is not among them (and were it reset, gate 4's first
    baseline call, untimed, would compile it again). Returns how many code objects were reset
    (0 when this torch has no ``reset_code`` or Dynamo was never imported)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._C._dynamo import eval_frame

    reset = getattr(eval_frame, "reset_code", None)
    if reset is None:
        return 0
    codes = candidate_codes(module, instance)
    for code in codes:
        reset(code)
    return len(codes)
