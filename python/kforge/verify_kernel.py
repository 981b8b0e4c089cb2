"""Replacement-kernel candidates for ``kforge verify --kernel NAME`` (GPU only).

The candidate is the source of one Inductor kernel module (what ``kforge inspect`` lists for
kernel NAME, edited). It is checked in the compiled problem itself: the problem's ``Model`` is
compiled (``baseline_mode`` of the policy), its wrapper module caught on the first call (before
any CUDA graph is recorded), and NAME is replaced by the candidate compiled with Inductor's own
``async_compile.triton`` — the same re-stitch point as ``kforge inspect``'s round trip. The
re-stitched compiled model is then the candidate of every model-level gate; in addition each
seed replays the kernel alone on the arguments the original got inside the model and compares
what both wrote (per-kernel correctness).
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Tuple

from .capture import _clone, _triton_globals, _WrapperHook, compile_kernel
from .verify_runner import DISTRIBUTIONS, Check, compare, make_inputs


class KernelCandidate:
    def __init__(self, problem: Any, kernel: str, source: str, mode: str, dev: Any, policy: Dict[str, Any]) -> None:
        self.problem, self.kernel, self.source, self.mode, self.dev, self.policy = problem, kernel, source, mode, dev, policy

    def restitch(self, ref_model: Any, ck: Check) -> Tuple[Any, List[Any]]:
        """(re-stitched compiled model, [the replacement kernel object]); per-kernel checks go to ``ck``."""
        import torch
        import torch._inductor.config as icfg

        torch._dynamo.reset()
        icfg.fx_graph_cache = False
        model = copy.deepcopy(ref_model)
        compiled = torch.compile(model, mode=self.mode)
        xs = make_inputs(self.problem, 0, "normal", self.dev)
        with _WrapperHook() as hook, torch.no_grad():
            compiled(*xs)
        owners = [m for m in hook.modules if self.kernel in _triton_globals(m)]
        if not owners:
            names = sorted(n for m in hook.modules for n in _triton_globals(m))
            raise LookupError(f"kernel {self.kernel} is not in the compiled problem (its Triton kernels: {', '.join(names) or 'none'})")
        mod = owners[0]
        original = getattr(mod, self.kernel)
        new = compile_kernel(self.kernel, self.source)
        self._per_kernel(ck, compiled, mod, original, new)
        setattr(mod, self.kernel, new)

        class Restitched(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = model

            def forward(self, *args: Any) -> Any:
                return compiled(*args)

        return Restitched().eval(), [new]

    def _per_kernel(self, ck: Check, compiled: Any, mod: Any, original: Any, new: Any) -> None:
        """Per seed: record the original kernel's arguments inside the model, replay the
        replacement on copies, compare every tensor it may write."""
        import torch

        for s in range(int(self.policy.get("seeds", 3))):
            xs = make_inputs(self.problem, 500 + s, DISTRIBUTIONS[s % len(DISTRIBUTIONS)], self.dev)
            rec: Dict[str, Any] = {}
            orig_run = original.run

            def run(*args: Any, **kw: Any) -> Any:
                if not rec:
                    rec["before"], rec["kw"] = _clone(args), dict(kw)
                    r = orig_run(*args, **kw)
                    rec["after"] = _clone(args)
                    return r
                return orig_run(*args, **kw)

            original.run = run
            try:
                with torch.no_grad():
                    compiled(*xs)
                torch.cuda.synchronize()
            finally:
                original.run = orig_run
            if not rec:
                ck.add("correctness", f"kernel-replay-seed-{s}", False, why=f"{self.kernel} did not run in the compiled model")
                continue
            args = _clone(rec["before"])
            kw = dict(rec["kw"])
            if "stream" in kw:
                kw["stream"] = torch.cuda.current_stream().cuda_stream
            try:
                new.run(*args, **kw)
                torch.cuda.synchronize()
                tensors = [(a, b) for a, b in zip(args, rec["after"]) if isinstance(b, torch.Tensor)]
                r = compare([a for a, _ in tensors], [b for _, b in tensors], self.policy)
            except Exception as e:
                r = {"ok": False, "why": f"the replacement raised {type(e).__name__}: {e}"}
            ck.add("correctness", f"kernel-replay-seed-{s}", r["ok"], **r)
