"""Replacement-kernel candidates for ``kforge verify --kernel NAME`` (GPU only).

The candidate is the source of one Inductor kernel module (what ``kforge inspect`` lists for
kernel NAME, edited). It is checked in the compiled problem itself:

1. per-kernel correctness, on a default-mode compile of the problem: per seed, the original
   kernel's arguments are recorded inside the model and the replacement is run alone on copies
   of them; everything it writes is compared with what the original wrote (this first run also
   autotunes the replacement, so no autotuning happens later during a CUDA-graph recording);
2. the problem compiled in the policy's ``baseline_mode``, its wrapper module caught on the first
   call — the warm-up, before any CUDA graph is recorded — and NAME replaced there: that
   re-stitched compiled model is the candidate of every model-level gate.

Compiles use static shapes: a generated kernel is specialized to its shapes, so ragged sizes do
not apply to replacement kernels. Under CUDA graphs, kernel launches are replayed by the graph,
not by the wrapper, so the launch-counting checks (ghost replay, kernels ran) do not apply.

torch is imported inside the functions that use it (the runner's entry point must start without
torch, to report its absence).
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Tuple

from ..harness import DISTRIBUTIONS, Check, clone_all, clone_output, compare, make_inputs
from ..inspect.inductor import CUDA_GRAPH_MODES, WrapperHook, compile_kernel, own_code_class, triton_globals


class KernelCandidate:
    def __init__(self, problem: Any, kernel: str, source: str, mode: str, dev: Any, policy: Dict[str, Any]) -> None:
        self.problem, self.kernel, self.source, self.mode, self.dev, self.policy = problem, kernel, source, mode, dev, policy
        self.cuda_graphs = mode in CUDA_GRAPH_MODES

    def _compiled(self, ref_model: Any, mode: str) -> Tuple[Any, Any, Any]:
        """(compiled model, wrapper module holding the kernel, the original kernel object)."""
        import torch
        import torch._inductor.config as icfg

        torch._dynamo.reset()
        icfg.fx_graph_cache = False
        model = copy.deepcopy(ref_model)
        # Its own code object: the performance gate's baseline, torch.compile(ref_model), must not
        # share this compile's cache entry (it would run the replacement too).
        model.__class__ = own_code_class(type(ref_model))
        compiled = torch.compile(model, mode=mode, dynamic=False)
        xs = make_inputs(self.problem, 0, "normal", self.dev)
        with WrapperHook() as hook, torch.no_grad():
            compiled(*xs)  # type: ignore[no-untyped-call]  # loads the wrapper; with CUDA graphs only the warm-up
        owners = [m for m in hook.modules if self.kernel in triton_globals(m)]
        if not owners:
            names = sorted(n for m in hook.modules for n in triton_globals(m))
            raise LookupError(f"kernel {self.kernel} is not in the compiled problem (its Triton kernels: {', '.join(names) or 'none'})")
        return compiled, owners[0], getattr(owners[0], self.kernel)

    def restitch(self, ref_model: Any, ck: Check) -> Tuple[Any, List[Any]]:
        """(re-stitched compiled model, [the replacement kernel object]); per-kernel checks go to ``ck``."""
        import torch

        new = compile_kernel(self.kernel, self.source)
        compiled, mod, original = self._compiled(ref_model, "default")
        self._per_kernel(ck, compiled, original, new)
        if self.mode != "default":
            compiled, mod, original = self._compiled(ref_model, self.mode)
        setattr(mod, self.kernel, new)

        class Restitched(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()

            def forward(self, *args: Any) -> Any:
                return compiled(*args)

        return Restitched().eval(), [] if self.cuda_graphs else [new]

    def _per_kernel(self, ck: Check, compiled: Any, original: Any, new: Any) -> None:
        import torch

        for s in range(int(self.policy.get("seeds", 3))):
            xs = make_inputs(self.problem, 500 + s, DISTRIBUTIONS[s % len(DISTRIBUTIONS)], self.dev)
            rec: Dict[str, Any] = {}
            orig_run = original.run

            def run(*args: Any, **kw: Any) -> Any:
                if not rec:
                    rec["before"], rec["kw"] = clone_all(args), dict(kw)
                    r = orig_run(*args, **kw)
                    rec["after"] = clone_all(args)
                    return r
                return orig_run(*args, **kw)

            original.run = run
            try:
                with torch.no_grad():
                    clone_output(compiled(*xs))
                torch.cuda.synchronize()
            finally:
                original.run = orig_run
            if not rec:
                ck.add("correctness", f"kernel-replay-seed-{s}", False, why=f"{self.kernel} did not run in the compiled model")
                continue
            args = clone_all(rec["before"])
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
