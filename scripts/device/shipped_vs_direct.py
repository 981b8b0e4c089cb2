"""Does the shipped ``ModelNew`` construct, rather than the harness, explain a measure-step/gate-4 gap?

For level-1 007 (max over the last dim, bf16) ``kforge optimize``'s measure step timed
max-autotune-no-cudagraphs at ~2.97x over max-autotune, while gate 4 of ``kforge verify`` timed the
shipped result file at ~2.05x. In ONE process, on the problem's default-size inputs, this builds
  (a) the baseline as the measure step does (``dispatch.prepare_one``: a copy, ``torch.compile(mode=B,
      dynamic=False)``), (b) the variant the same way (the direct compile the measure step timed),
  (c) the shipped construct: ``result.model_new_source``'s module, written to a file, imported with
      the verify runner's ``load_module``, ``ModelNew(*init)`` with the reference's weights loaded,
  (a_bg) on a GPU also gate 4's own baseline (``perf.BaselineCompile``: the reference compiled in a
      thread, no ``dynamic=False``),
then times b and c against a with both harnesses' real round functions (``dispatch.time_rounds`` +
``dispatch.choose``; ``perf.timed_outputs_round`` on gate 4's rotating input sets), c against a_bg with
gate 4's, and each construct's per-call host and device ms apart (a spin kernel in front, CUDA events
around the call, ``perf_counter`` around the launch; on the CPU device = host). If c's speedup is
low in both harnesses and c's host ms exceeds its device ms, the construct explains the gap; if b
is low under gate 4 too, the harness (rotation, ``x.add_(0)``) does.

Device (about 2-3 min for both):
  python3 scripts/device/shipped_vs_direct.py problems/level1/007_max_last_dim_bf16.py \
      max-autotune-no-cudagraphs --out $OUT/shipped_vs_direct.json
  python3 scripts/device/shipped_vs_direct.py problems/level1/010_rmsnorm_bf16.py \
      max-autotune-no-cudagraphs --out $OUT/shipped_vs_direct_010.json   # the control
CPU smoke (seconds; no a_bg): python3 scripts/device/shipped_vs_direct.py tests/candidates/problems/row_softmax.py \
      default --baseline default --device cpu --rounds 2 --out /tmp/shipped_vs_direct.json
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

from kforge import bench  # noqa: E402
from kforge.harness import clone_output, finite_json, make_inputs, mean_half, noise_floor  # noqa: E402
from kforge.optimize import dispatch  # noqa: E402
from kforge.optimize.result import model_new_source  # noqa: E402
from kforge.verify import perf  # noqa: E402
from kforge.verify.runner import load_module  # noqa: E402

Fn = Callable[..., Any]


def direct(ref: dispatch.Reference, variant: str, dev: Any) -> Fn:
    """``variant`` prepared exactly as the measure step prepares it (a copy, compiled, first call judged)."""
    ready: Dict[str, Fn] = {}
    report: Dict[str, Dict[str, Any]] = {}
    dispatch.prepare_one(variant, ref.model, ref, dev, ready, report)
    if variant not in ready:
        raise SystemExit(f"shipped_vs_direct: {variant} not prepared: {report[variant]}")
    return ready[variant]


def shipped(problem_path: str, problem: Any, ref: dispatch.Reference, variant: str, baseline: str, dev: Any, tmp: str) -> Any:
    """The result file ``kforge optimize`` would ship for ``variant``, built as the verify cascade builds a candidate."""
    import torch

    with open(problem_path) as f:
        source = model_new_source(problem_path, f.read(), variant, {"baseline": baseline, "winner": variant, "modes": {}})
    path = os.path.join(tmp, "model_new.py")
    with open(path, "w") as f:
        f.write(source)
    torch.manual_seed(0)
    cand = load_module(path, "candidate").ModelNew(*problem.get_init_inputs()).to(dev).eval()
    cand.load_state_dict(ref.model.state_dict(), strict=False)
    with torch.no_grad():
        verdict = dispatch.matches(clone_output(cand(*ref.xs)), ref)  # the first call compiles
    if not verdict["ok"]:
        raise SystemExit(f"shipped_vs_direct: the shipped ModelNew differs from eager: {verdict}")
    return cand


def summary(rows: Sequence[Sequence[float]]) -> Dict[str, Any]:
    """Speedup (geometric mean of baseline/x) with its 95 % interval, the noise floor (baseline-again/baseline)."""
    logs = [math.log(a / b) for a, b, _ in rows]
    mean, half = mean_half(logs)
    return {"speedup": math.exp(mean), "ci95": [math.exp(mean - half), math.exp(mean + half)],
            "noise_floor": math.exp(noise_floor([math.log(c / a) for a, _, c in rows])),
            "per_round_ms": [list(r) for r in rows]}


def gate4(problem: Any, ref: dispatch.Reference, base: Fn, cands: Dict[str, Fn], dev: Any, rounds: int) -> Dict[str, Any]:
    """Each candidate against ``base`` as ``perf.performance_gate`` times it: per round its input sets
    (seeds 400+3r+k, rotated with ``x.add_(0)``), one untimed call of each, ``perf.timed_outputs_round``."""
    import torch

    rows: Dict[str, List[List[float]]] = {k: [] for k in cands}
    sampled: Dict[str, List[bool]] = {k: [] for k in cands}
    with torch.no_grad():
        for r in range(rounds):
            sets = [make_inputs(problem, 400 + 3 * r, "normal", dev)]
            more = 3 if perf._bytes(sets[0]) <= perf.ROTATION_BYTES else 2
            sets += [make_inputs(problem, 400 + 3 * r + k, "normal", dev) for k in range(1, more)]
            for name, cand in cands.items():
                base(*sets[0])
                cand(*sets[0])
                times, check = perf.timed_outputs_round(ref.model, base, cand, sets, f"probe:gate4-{name}-{r}", {})
                rows[name].append(list(times))
                sampled[name].append(bool(check["ok"]))
    return {k: {**summary(v), "timed_outputs_ok": all(sampled[k])} for k, v in rows.items()}


def per_call(fn: Fn, xs: Sequence[Any], dev: Any, calls: int) -> Dict[str, float]:
    """Median host ms (the launch, ``perf_counter``) and device ms (CUDA events behind a spin kernel
    that covers the launch, so the events see the device work alone) of single calls after warm-up."""
    import torch

    host: List[float] = []
    device: List[float] = []
    with torch.no_grad():
        for _ in range(20):
            fn(*xs)
        if dev.type != "cuda":
            for _ in range(calls):
                t0 = time.perf_counter()
                fn(*xs)
                host.append((time.perf_counter() - t0) * 1e3)
            return {"host_ms": statistics.median(host), "device_ms": statistics.median(host)}
        spin = bench.spin_length_us(bench.probe_host_us(torch, lambda: fn(*xs), None))
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        for _ in range(calls):
            torch.cuda.synchronize(dev)
            torch.cuda._sleep(int(spin * bench.SPIN_CYCLES_PER_US))  # type: ignore[no-untyped-call]
            start.record()
            t0 = time.perf_counter()
            fn(*xs)
            t1 = time.perf_counter()
            end.record()
            torch.cuda.synchronize(dev)
            host.append((t1 - t0) * 1e3)
            device.append(float(start.elapsed_time(end)))
    return {"host_ms": statistics.median(host), "device_ms": statistics.median(device), "spin_us": spin}


def main() -> int:
    ap = argparse.ArgumentParser(prog="shipped_vs_direct.py", description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("problem")
    ap.add_argument("variant")
    ap.add_argument("--baseline", default="max-autotune")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200, help="single calls per construct for the host/device medians")
    a = ap.parse_args()
    os.environ["KFORGE_DEVICE"] = a.device  # gate 4's round passes no device: do_bench_interleaved reads this
    import torch

    dev = torch.device(a.device)
    problem = dispatch.load_problem(a.problem, "default")
    ref = dispatch.reference(problem, dev)
    with dispatch.room_to_compile(8), tempfile.TemporaryDirectory() as tmp:
        fns: Dict[str, Fn] = {"a": direct(ref, a.baseline, dev), "b": direct(ref, a.variant, dev)}
        fns["c"] = shipped(a.problem, problem, ref, a.variant, a.baseline, dev, tmp)
        if dev.type == "cuda":  # gate 4's own baseline: the reference compiled in a thread (verify's background compile)
            fns["a_bg"] = perf.BaselineCompile(ref.model, a.baseline, make_inputs(problem, 399, "normal", dev)).wait()
            with torch.no_grad():
                fns["a_bg"](*ref.xs)
        t0 = time.perf_counter()
        measure = dispatch.choose("a", dispatch.time_rounds(problem, {k: fns[k] for k in "abc"}, "a", dev, a.rounds))
        verify = gate4(problem, ref, fns["a"], {"b": fns["b"], "c": fns["c"]}, dev, a.rounds)
        if "a_bg" in fns:
            verify["c_vs_a_bg"] = gate4(problem, ref, fns["a_bg"], {"c": fns["c"]}, dev, a.rounds)["c"]
        timing_s = time.perf_counter() - t0
        calls = {k: per_call(f, ref.xs, dev, a.calls) for k, f in fns.items()}
    out = {
        "problem": a.problem, "variant": a.variant, "baseline": a.baseline, "device": a.device, "rounds": a.rounds,
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None, "torch": torch.__version__,
        "triton": dispatch.triton_version(), "timing_s": round(timing_s, 1),
        "measure_step": {"noise_floor": measure["noise_floor"],
                         **{k: {"speedup": v["speedup"], "ci95": v["ci95"],
                                "per_round_ms": [[r["baseline_ms"], r["mode_ms"], r["baseline_again_ms"]] for r in v["per_round"]]}
                            for k, v in measure["modes"].items()}},
        "gate4": verify, "per_call": calls,
        "constructs": {"a": f"torch.compile(copy, mode={a.baseline!r}, dynamic=False)",
                       "b": f"torch.compile(copy, mode={a.variant!r}, dynamic=False)",
                       "c": "the shipped ModelNew (result.model_new_source)",
                       "a_bg": f"perf.BaselineCompile(reference, {a.baseline!r})"},
    }
    with open(a.out, "w") as f:
        json.dump(finite_json(out), f, indent=1, allow_nan=False)
    print(f"\n{a.problem}  {a.variant} vs {a.baseline}  ({out['gpu'] or 'cpu'}, torch {torch.__version__})")
    print(f"{'':6}{'measure step':>14}{'gate 4':>10}{'host ms':>10}{'device ms':>11}")
    for k in fns:
        m, g = measure["modes"].get(k, {}).get("speedup"), verify.get(k, {}).get("speedup")
        ms, gs = f"{m:.3f}x" if m else "-", f"{g:.3f}x" if g else "-"
        print(f"{k:6}{ms:>14}{gs:>10}{calls[k]['host_ms']:10.4f}{calls[k]['device_ms']:11.4f}")
    if "c_vs_a_bg" in verify:
        print(f"c against a_bg (gate 4's own baseline), gate 4: {verify['c_vs_a_bg']['speedup']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
