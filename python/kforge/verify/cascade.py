"""The runtime checks of ``kforge verify`` in order, one method per stage (``Cascade``): the
candidate built, the dry run, gate 2 (seeds x input distributions, NaN sentinels, ragged sizes,
inputs unchanged), gate 3 (eager at 1e-4, else the fp64 rule, judged on gate 2's runs), the
exploit checks (determinism, input perturbation, re-validation, threads, timer and library
identity, ghost replay, kernels ran, side streams), the dispatch record, then gate 4
(:mod:`.perf`) on a GPU. The helpers the stages use are in :mod:`.checks`.

torch is imported inside the functions that use it (the runner's entry point must start without
torch, to report its absence).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from ..harness import DISTRIBUTIONS, Check, Fp64Reference, clone_all, clone_output, compare, flat, judge, make_inputs, same_tensor, same_values, thread_check
from .checks import (FLOAT_DTYPES, LaunchCounter, RunnerError, environment_error, jit_functions, kernel_name,
                     library_identities, model_check, own_failure, plant_sentinels, release, timer_identities,
                     torch_own_wrapper)
from .dispatch import DispatchRecord, forget_dynamo_state
from .native import NativeCounter, kernel_streams, native_functions
from .perf import BaselineCompile, performance_gate

#: A gate 3 judgement made on a gate 2 run: (check name, passed, evidence).
ModelJudgement = Tuple[str, bool, Dict[str, Any]]


def run_checks(problem: Any, candidate: Any, policy: Dict[str, Any], dev: Any, performance: bool,
               timers0: Dict[str, int], threads0: Set[Any], libs0: Optional[Dict[str, int]] = None,
               progress: Optional[str] = None, native0: Optional[Dict[int, str]] = None,
               background_compile: bool = False) -> Dict[str, Any]:
    """All runtime checks; ``timers0`` and ``threads0`` were taken before the candidate was imported.

    ``candidate`` is the candidate's module (a ``ModelNew`` file) or, for a replacement kernel, a
    ``kernel.KernelCandidate`` (the compiled model re-stitched with the kernel). With
    ``background_compile`` (the caller primed torch.compile before its identity snapshots) the
    baseline of gate 4 compiles in a thread while the checks run (``perf.BaselineCompile``)."""
    return Cascade(problem, candidate, policy, dev, timers0, threads0, libs0, progress, native0).run(performance, background_compile)


class Cascade:
    """One candidate's runtime checks and what their stages share: the reference and the built
    candidate, its kernels (Triton and native), the dispatch record, the check records."""

    def __init__(self, problem: Any, candidate: Any, policy: Dict[str, Any], dev: Any, timers0: Dict[str, int],
                 threads0: Set[Any], libs0: Optional[Dict[str, int]], progress: Optional[str],
                 native0: Optional[Dict[int, str]]) -> None:
        import torch

        self.problem, self.candidate, self.policy, self.dev = problem, candidate, policy, dev
        self.timers0, self.threads0, self.libs0, self.native0 = timers0, threads0, libs0, native0
        self.ck = Check(progress)
        self.seeds = list(range(int(policy.get("seeds", 3))))
        self.kernel_mode = hasattr(candidate, "restitch")
        torch.manual_seed(0)
        self.init = problem.get_init_inputs()
        torch.manual_seed(1234)
        self.ref_model = problem.Model(*self.init).to(dev).eval()
        torch.manual_seed(1234)
        self.record = DispatchRecord(policy, applies=not self.kernel_mode)
        self.cand: Any = None
        self.fns: List[Any] = []
        self.nfns: List[Tuple[str, Any]] = []
        self.compiled: Optional[BaselineCompile] = None
        #: The fp64 reference every comparison's fp64 rule uses (made on a tolerance miss, released after).
        self.fp64 = Fp64Reference(self.ref_model)

    def run(self, performance: bool, background_compile: bool) -> Dict[str, Any]:
        began = time.perf_counter()
        if not (self.construct() and self.dry_run()):
            return {"checks": self.ck.items}
        if performance and self.dev.type == "cuda" and background_compile:
            # The baseline compiles beside the checks (gate 4 needs it; the checks do not).
            self.compiled = BaselineCompile(self.ref_model, str(self.policy.get("baseline_mode", "default")), self.inputs(399))
        self.model_level(self.correctness())
        self.exploits()
        release(self.dev)
        self.record.check(self.ck)
        if not self.kernel_mode and not self.failed():
            forget_dynamo_state(self.candidate, self.cand)  # gate 4 times the compiled forward, not the recorded one
            self.unrecorded_forward()
        return self.performance(performance, began)

    # --- what the stages share ---------------------------------------------------------------

    def inputs(self, seed: int, dist: str = "normal") -> List[Any]:
        return make_inputs(self.problem, seed, dist, self.dev)

    def reference(self, xs: Sequence[Any]) -> Any:
        import torch

        with torch.no_grad():
            return self.ref_model(*xs)

    def call(self, xs: Sequence[Any], recorded: bool = True) -> Any:
        """A copy of the candidate's output (a CUDA-graph replay overwrites its outputs on the
        next replay), or the exception it raised (then every comparison fails). The aten ops its
        forward dispatches are recorded (``record``), unless not ``recorded``."""
        import torch

        try:
            with torch.no_grad():
                with self.record if recorded else contextlib.nullcontext():
                    out = self.cand(*xs)
                return clone_output(out)
        except Exception as e:
            env = environment_error(e, self.dev)
            if env is not None:
                raise env from e
            return own_failure(e, self.dev)

    def failed(self) -> List[str]:
        """The checks failed so far, as ``gate:name``, in the order they ran."""
        return [f"{c['gate']}:{c['name']}" for c in self.ck.items if c["ok"] is False]

    def sync(self) -> None:
        import torch

        if self.dev.type == "cuda":
            torch.cuda.synchronize()

    # --- the stages ----------------------------------------------------------------------------

    def construct(self) -> bool:
        """The candidate built (a replacement kernel: the compiled problem re-stitched with it)."""
        ck = self.ck
        if self.kernel_mode:
            ck.begin("dry-run", "compile-and-restitch")
            try:
                self.cand, self.fns = self.candidate.restitch(self.ref_model, ck)
            except Exception as e:
                ck.add("dry-run", "compile-and-restitch", False, error=f"{type(e).__name__}: {e}")
                return False
            # The harness compiled the problem (Inductor's compile threads); a thread the
            # candidate's calls start is still counted (its source's imports and threads are gate 1's).
            self.threads0 = self.threads0 | set(threading.enumerate())
            return True
        ck.begin("dry-run", "construct")
        try:
            self.cand = self.candidate.ModelNew(*self.init).to(self.dev).eval()
        except Exception as e:
            env = environment_error(e, self.dev)
            if env is not None:
                raise env from e
            e = own_failure(e, self.dev)
            ck.add("dry-run", "construct", False, error=f"{type(e).__name__}: {e}")
            return False
        try:  # same weights as the reference where the parameter names agree
            self.cand.load_state_dict(self.ref_model.state_dict(), strict=False)
        except Exception:
            pass
        self.fns = jit_functions(self.candidate)
        self.nfns = native_functions(self.candidate, self.cand)
        return True

    def dry_run(self) -> bool:
        ck = self.ck
        ck.begin("dry-run", "runs")
        xs = self.inputs(0)
        with self.record.of_reference():  # what the reference dispatches (are copies its work?)
            self.reference(clone_all(xs))
        try:
            with LaunchCounter(self.fns) as lc, NativeCounter(self.nfns) as nc:
                out = self.call(xs)
                self.sync()
            if isinstance(out, BaseException):
                ck.add("dry-run", "runs", False, error=f"{type(out).__name__}: {out}")
                return False
            ck.add("dry-run", "runs", True, kernel_launches=lc.count, native_calls=nc.calls)
        except RunnerError:
            raise
        except Exception as e:
            ck.add("dry-run", "runs", False, error=f"{type(e).__name__}: {e}")
            return False
        if not self.kernel_mode:  # an extension built lazily, in the first forward
            self.nfns = native_functions(self.candidate, self.cand)
        return True

    def correctness(self) -> List[ModelJudgement]:
        """Gate 2: seeds x distributions, then the ragged sizes. Gate 3 (model level) is judged
        on the runs of the first three seeds' normal inputs: the same candidate output, at 1e-4,
        else by the fp64 rule. Returns those judgements."""
        strict = {"rtol": {k: 1e-4 for k in FLOAT_DTYPES}, "atol": {k: 1e-4 for k in FLOAT_DTYPES}}
        fp64 = self.fp64
        model: List[ModelJudgement] = []
        for s in self.seeds:
            for dist in DISTRIBUTIONS:
                judged = self.seed_run(s, dist, strict, fp64, judge=dist == "normal" and s in self.seeds[:3])
                if judged is not None:
                    model.append(judged)
        fp64.release()
        release(self.dev)
        self.ragged()
        return model

    def seed_run(self, s: int, dist: str, strict: Dict[str, Any], fp64: Fp64Reference, judge: bool) -> Optional[ModelJudgement]:
        """One correctness run of seed ``s``; with ``judge``, also gate 3's judgement of it."""
        out, ref = self.checked_run(f"seed-{s}-{dist}", 100 + s, dist)
        return model_check(s, out, ref, lambda: self.inputs(100 + s, dist), strict, fp64) if judge else None

    def checked_run(self, name: str, seed: int, dist: str) -> Tuple[Any, Any]:
        """``correctness:NAME``: the candidate against the reference on inputs of ``seed``;
        (its output, the reference's). Inputs are regenerated instead of copied (make_inputs is
        deterministic and takes milliseconds on a GPU): the reference runs on a set of its own,
        the candidate on a fresh one, and a third, made after its call, shows whether it changed
        its inputs. At GB sizes each copy not kept is an input set of device memory less."""
        self.ck.begin("correctness", name)
        ref = self.reference(self.inputs(seed, dist))
        xs = self.inputs(seed, dist)
        plant_sentinels(ref)
        out = self.call(xs)
        self.sync()
        r = judge(out, ref, self.policy, self.fp64, lambda: self.inputs(seed, dist))
        unchanged = same_values(xs, self.inputs(seed, dist))
        self.ck.add("correctness", name, r["ok"] and unchanged, **r, inputs_unchanged=unchanged)
        return out, ref

    def ragged(self) -> None:
        """Gate 2 on the policy's ragged sizes: module-level size variables set to its values."""
        ragged = dict(self.policy.get("ragged", {}))
        if self.kernel_mode:
            if ragged:
                self.ck.add("correctness", "ragged", None, note="a replacement kernel is specialized to the compiled shapes")
            return
        for name, value in ragged.items():
            if not isinstance(getattr(self.problem, name, None), int):
                raise RunnerError(f"policy: ragged size {name} is not a module-level integer of the problem")
            own = getattr(self.problem, name)
            setattr(self.problem, name, int(value))
            try:
                for s in self.seeds:
                    self.checked_run(f"ragged-{name}={value}-seed-{s}", 150 + s, DISTRIBUTIONS[s % len(DISTRIBUTIONS)])
            finally:
                setattr(self.problem, name, own)

    def model_level(self, model: List[ModelJudgement]) -> None:
        """Gate 3: at 1e-4 on 3 seeds, else the fp64 rule (judged on gate 2's runs)."""
        for name, ok, evidence in model:
            self.ck.add("model", name, ok, **evidence)
        release(self.dev)

    def exploits(self) -> None:
        self.determinism()
        self.input_perturbation()
        self.revalidation()
        if self.compiled is not None:
            self.compiled.wait()  # its thread is kforge's, not the candidate's: gone before threads are counted
        release(self.dev)
        self.identities()
        self.ghost_replay()
        self.streams()

    def unrecorded_forward(self) -> None:
        """``exploits:unrecorded-forward``: the forward called as a user calls it, outside the
        dispatch record (a ``torch.compile`` inside it compiles now), on fresh inputs, against
        the reference. Every check before ran it under the record's modes; gate 4 times it
        without them, and a GPU-less or ``--no-performance`` run has no gate 4. Not run once a
        check failed (it may compile: a rejected candidate's compile is time lost). A compile
        that raises here fails it, with the error as its evidence."""
        self.ck.begin("exploits", "unrecorded-forward")
        ref = self.reference(self.inputs(309))
        plant_sentinels(ref)
        out = self.call(self.inputs(309), recorded=False)
        self.sync()
        r = judge(out, ref, self.policy, self.fp64, lambda: self.inputs(309))
        self.ck.add("exploits", "unrecorded-forward", r["ok"], **r)
        release(self.dev)

    def determinism(self) -> None:
        self.ck.begin("exploits", "determinism")
        xs = self.inputs(300)
        det = compare(self.call(clone_all(xs)), self.call(clone_all(xs)), self.policy)
        self.ck.add("exploits", "determinism", det["ok"], **det)

    def input_perturbation(self) -> None:
        import torch

        self.ck.begin("exploits", "input-perturbation")
        xs = self.inputs(301)
        self.call(xs)
        for x, n in zip(xs, self.inputs(302, "uniform")):
            if isinstance(x, torch.Tensor):
                # Same tensor objects, same storage, same version counter (written through .data),
                # new contents: a cache keyed on id, data_ptr or _version returns a stale result.
                x.data.copy_(n)
        ref_new = self.reference(clone_all(xs))
        plant_sentinels(ref_new)
        follows = judge(self.call(xs), ref_new, self.policy, self.fp64, lambda: self.inputs(302, "uniform"))
        self.ck.add("exploits", "input-perturbation", follows["ok"], **follows)

    def revalidation(self) -> None:
        self.ck.begin("exploits", "revalidation")
        calls = int(self.policy.get("revalidate_calls", 10))
        xs = self.inputs(303)
        for _ in range(calls):
            self.call(xs)
        ref = self.reference(clone_all(xs))
        plant_sentinels(ref)
        late = judge(self.call(xs), ref, self.policy, self.fp64, lambda: self.inputs(303))
        self.ck.add("exploits", "revalidation", late["ok"], after_calls=calls, **late)

    def identities(self) -> None:
        """Threads the candidate left running; timing and library functions it replaced."""
        ck = self.ck
        thread_check(ck, "thread-count", self.threads0, self.kernel_mode, native_before=self.native0)
        timers1 = timer_identities()
        changed = sorted(k for k in self.timers0 if self.timers0[k] != timers1.get(k))
        ck.add("exploits", "timer-identity", not changed, replaced=changed)
        if self.libs0 is None:
            return
        libs0, libs1 = self.libs0, library_identities(self.problem)
        replaced = sorted(k for k in libs0 if libs1.get(k) != libs0[k] and not torch_own_wrapper(k, libs0[k]))
        added = sorted(k for k in libs1 if k not in libs0 and k.startswith(("torch.Tensor.", "torch.nn.Module.", "problem.Model.")))
        ck.add("exploits", "library-identity", not replaced and not added, replaced=replaced[:20], added=added[:20],
               note="the reference's functions were replaced: the reference no longer computes the reference" if replaced or added else "")

    def ghost_replay(self) -> None:
        """Outputs with the candidate's kernels (Triton and native) made no-ops must differ, and
        its kernels must run."""
        ck, fns, nfns = self.ck, self.fns, self.nfns
        if self.kernel_mode and getattr(self.candidate, "cuda_graphs", False):
            for n in ("ghost-replay", "kernels-ran"):
                ck.add("exploits", n, None, note="under CUDA graphs the graph replays the launches; the per-kernel replay checked the kernel")
            return
        if not fns and not nfns and self.policy.get("torch_policy") == "reference-ops":
            for n in ("ghost-replay", "kernels-ran"):
                ck.add("exploits", n, None, kernels=[], native_functions=[],
                       note="policy reference-ops: the candidate computes with the reference's own torch ops (and the aten ops "
                            "the policy's allowed_aten_ops names), by design; the dispatch record checks it dispatched nothing else")
            return
        if not fns and not nfns:
            ck.add("exploits", "ghost-replay", False, kernels=[], native_functions=[],
                   note="the candidate defines no Triton kernel and holds no native extension of its own")
            ck.add("exploits", "kernels-ran", False, launches=0, note="no Triton kernel or native function to run")
            return
        ck.begin("exploits", "ghost-replay")
        xs = self.inputs(304)
        real = self.call(clone_all(xs))
        with LaunchCounter(fns) as lc, NativeCounter(nfns, ghost=True) as ng:
            lc.ghost = True
            args = clone_all(xs)
            plant_sentinels(real)
            try:
                same = compare(self.call(args), real, {"rtol": {}, "atol": {}})["ok"]
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
            self.call(clone_all(xs))
        ck.add("exploits", "kernels-ran", lc.count + nc.count > 0, launches=lc.count, native_calls=nc.calls)

    def streams(self) -> None:
        """The output read after the current stream synchronized equals the one after the whole
        device did; a native candidate's kernels all ran on the current stream."""
        import torch

        if self.dev.type != "cuda":
            self.ck.add("exploits", "streams-synchronized", None, note="CPU run: no streams")
            return
        self.ck.begin("exploits", "streams-synchronized")
        xs = self.inputs(305)
        with torch.no_grad():
            out = self.cand(*xs)
            torch.cuda.current_stream().synchronize()
            early = [t.clone() for t in flat(out)]
            torch.cuda.synchronize()
        late_ok = all(same_tensor(e, t) for e, t in zip(early, flat(out)))
        # Native code launches where the static gate cannot see: which stream each kernel of a
        # forward ran on (torch.profiler), not only whether a race happened to show.
        with torch.no_grad():
            streams = kernel_streams(lambda: self.cand(*clone_all(xs))) if self.nfns else {}
        off = streams.get("off_stream", [])
        self.ck.add("exploits", "streams-synchronized", late_ok and not off, native_streams=streams,
                    note="output read after the current stream vs after the whole device synchronized"
                         + (f"; {len(off)} kernel(s) of the native code ran off the current stream" if off else ""))

    def performance(self, requested: bool, began: float) -> Dict[str, Any]:
        """Gate 4 (GPU), unless an earlier check failed; the result with its phase seconds."""
        ck, dev = self.ck, self.dev
        failed = self.failed()
        if not (requested and dev.type == "cuda"):
            ck.add("performance", "speedup", None, note="needs a GPU" if dev.type != "cuda" else "not requested")
            return {"checks": ck.items, "phase_seconds": {"checks": round(time.perf_counter() - began, 3)}}
        if failed:
            ck.add("performance", "speedup", None, note=f"not timed: already rejected by {failed[0]}")
            return {"checks": ck.items, "phase_seconds": {"checks": round(time.perf_counter() - began, 3)}}
        checked = time.perf_counter()
        ck.begin("performance", "speedup")
        phases = performance_gate(ck, self.problem, self.ref_model, self.cand, self.policy, dev, self.compiled)
        if self.compiled is not None:
            phases["baseline-compile-beside-checks"] = round(self.compiled.seconds, 3)
        return {"checks": ck.items, "phase_seconds": {"checks": round(checked - began, 3), **phases}}
