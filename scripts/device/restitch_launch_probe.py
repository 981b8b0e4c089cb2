"""Why a re-stitched forward costs more host time than the compile it came from (session 32: the
large LSTM's re-stitch round trip was 1.0417x, beyond its floor of 1.0074, with 80 bit-identical
kernels replaced, both sides launching through Inductor's static launcher: about 1.9 us more per
replaced launch, on the host).

    python3 scripts/device/restitch_launch_probe.py PROBLEM OUT.json [--size large] [--calls 200]

No daemon. One compile of PROBLEM in default mode (no CUDA graphs: the wrapper looks its kernels
up at every call); every Triton kernel replaced the way `kforge inspect`'s round trip does it
(`compile_kernel` from its own source, `pin_config` to the original's configuration), then:
  - host time per forward, originals against replacements, in alternating blocks (GPU idle
    before each call, as `kforge.bench`'s host probe);
  - per kernel, host time of one `run` call of the original against its replacement on the
    arguments the wrapper passed it (recorded once), in alternating blocks;
  - cProfile of each side over the same calls: the functions whose own time differs most;
  - the attributes that differ between each original and its replacement (their types, the
    launcher's type and fields, `inductor_meta` and `triton_meta` keys whose values differ, the
    instance attributes and the size of the instance dict: a shared-keys dict against a
    materialized one changes how fast every `self.x` in `run` is).
Writes OUT.json (small) and prints a short table last.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics as st
import sys
import time
from typing import Any, Callable, Dict, List, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


def host_blocks(torch: Any, sides: Dict[str, Callable[[], Any]], calls: int, blocks: int = 6) -> Dict[str, List[float]]:
    """Per side, the host time of each call (us), the sides alternating block by block."""
    out: Dict[str, List[float]] = {k: [] for k in sides}
    for b in range(blocks):
        order = list(sides) if b % 2 == 0 else list(reversed(list(sides)))
        for name in order:
            fn = sides[name]
            for _ in range(max(1, calls // blocks)):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                out[name].append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return out


def profiled(fn: Callable[[], Any], calls: int) -> Dict[str, Tuple[int, float]]:
    """Per function (file:line name), its calls and own time (s) over ``calls`` calls of fn."""
    p = cProfile.Profile()
    p.enable()
    for _ in range(calls):
        fn()
    p.disable()
    stats = pstats.Stats(p).stats  # type: ignore[attr-defined]
    return {f"{os.path.basename(k[0])}:{k[1]} {k[2]}": (v[1], v[2]) for k, v in stats.items()}


def differing_attributes(old: Any, new: Any) -> Dict[str, Any]:
    """What differs between an original kernel object and its replacement."""
    out: Dict[str, Any] = {}
    if type(old) is not type(new):
        out["type"] = [type(old).__qualname__, type(new).__qualname__]
    for meta in ("inductor_meta", "triton_meta"):
        a, b = getattr(old, meta, None) or {}, getattr(new, meta, None) or {}
        keys = sorted(k for k in set(a) | set(b) if repr(a.get(k)) != repr(b.get(k)))
        if keys:
            out[meta] = {k: [repr(a.get(k))[:120], repr(b.get(k))[:120]] for k in keys}
    la, lb = (getattr(old, "launchers", None) or [None])[0], (getattr(new, "launchers", None) or [None])[0]
    if type(la) is not type(lb):
        out["launcher_type"] = [type(la).__qualname__, type(lb).__qualname__]
    fa = {k: repr(v)[:80] for k, v in vars(la).items()} if hasattr(la, "__dict__") else {}
    fb = {k: repr(v)[:80] for k, v in vars(lb).items()} if hasattr(lb, "__dict__") else {}
    diff = sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k) and "0x" not in (fa.get(k, "") + fb.get(k, "")))
    if diff:
        out["launcher_fields"] = {k: [fa.get(k), fb.get(k)] for k in diff}
    own_a = sorted(k for k in vars(old)) if hasattr(old, "__dict__") else []
    own_b = sorted(k for k in vars(new)) if hasattr(new, "__dict__") else []
    # Newer Inductors keep a steady-state launcher after the first launch (a fast path, "~2us"
    # in their comments): one side without it would cost about what the LSTM's re-stitch does.
    fast = [type(getattr(x, "_cached_launcher", "absent")).__qualname__ for x in (old, new)]
    if fast[0] != fast[1]:
        out["cached_launcher"] = fast
    sizes = [sys.getsizeof(vars(x)) if hasattr(x, "__dict__") else None for x in (old, new)]
    if sizes[0] != sizes[1]:  # a shared-keys (split) instance dict against a materialized one
        out["instance_dict_bytes"] = sizes
    if own_a != own_b:
        out["instance_attributes"] = {"only_original": sorted(set(own_a) - set(own_b)),
                                      "only_replacement": sorted(set(own_b) - set(own_a))}
    return out


def replaced_pairs(hook_modules: List[Any]) -> Tuple[List[Tuple[Any, str, Any, Any]], Dict[str, str]]:
    """(module, name, original, replacement) for every Triton kernel, as the round trip builds them."""
    from kforge.inspect.inductor import compile_kernel, kernel_sources, pin_config, triton_globals

    pairs, unpinned = [], {}
    for mod in hook_modules:
        with open(mod.__file__) as f:
            sources = kernel_sources(f.read())
        for name, old in triton_globals(mod).items():
            src = sources.get(name)
            if src is None:
                continue
            new = compile_kernel(name, src + "\n# kforge re-stitch launch probe\n")
            why = pin_config(new, old)
            if why is not None:
                unpinned[name] = why
                continue
            pairs.append((mod, name, old, new))
    return pairs, unpinned


def recorded_args(torch: Any, pairs: List[Tuple[Any, str, Any, Any]], forward: Callable[[], Any]) -> Dict[str, Any]:
    """Each original's `run` arguments of one forward (the first call of each kernel)."""
    seen: Dict[str, Any] = {}
    restore = []
    for _mod, name, old, _new in pairs:
        orig = old.run

        def spy(*args: Any, _orig: Any = orig, _name: str = name, **kwargs: Any) -> Any:
            seen.setdefault(_name, (args, kwargs))
            return _orig(*args, **kwargs)

        old.run = spy
        restore.append((old, orig))
    forward()
    torch.cuda.synchronize()
    for old, _orig in restore:
        del old.run  # back to the class's method: no instance attribute left behind
    return seen


def summary(xs: List[float]) -> Dict[str, float]:
    xs = sorted(xs)
    return {"median_us": round(st.median(xs), 2), "p10_us": round(xs[len(xs) // 10], 2),
            "p90_us": round(xs[(9 * len(xs)) // 10], 2), "n": len(xs)}


def per_kernel_run(torch: Any, pairs: List[Tuple[Any, str, Any, Any]], args: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The first 12 kernels' `run` alone, original against replacement, on recorded arguments (us)."""
    rows = []
    for _mod, name, old, new in pairs[:12]:
        if name not in args:
            continue
        pos, kw = args[name]
        one = {"original": lambda o=old, p=pos, k=kw: o.run(*p, **k),
               "replacement": lambda n=new, p=pos, k=kw: n.run(*p, **k)}
        t = host_blocks(torch, one, 120)
        rows.append({"kernel": name, **{k: summary(v)["median_us"] for k, v in t.items()}})
    return rows


def own_time_deltas(prof: Dict[str, Dict[str, Tuple[int, float]]], calls_n: int) -> List[Dict[str, Any]]:
    """The 15 functions whose own time per forward differs most, replacements minus originals."""
    keys = set(prof["originals"]) | set(prof["replacements"])
    own = sorted(((prof["replacements"].get(k, (0, 0.0))[1] - prof["originals"].get(k, (0, 0.0))[1], k) for k in keys),
                 key=lambda x: -abs(x[0]))[:15]
    return [{"function": k, "delta_us": round(d / calls_n * 1e6, 2),
             "calls_per_forward": [round(prof[s].get(k, (0, 0))[0] / calls_n, 1) for s in ("originals", "replacements")]}
            for d, k in own]


def print_table(report: Dict[str, Any]) -> None:
    """The probe's findings, short, for people."""
    print(f"{report['problem']} ({report['size']}): {report['kernels_replaced']} kernels replaced, "
          f"{len(report['unpinned'])} unpinned; launchers {report['launchers']}")
    print(f"{'forward':<24} {'median us':>10} {'p10':>9} {'p90':>9}")
    for k, v in report["forward_host"].items():
        print(f"{k:<24} {v['median_us']:>10.1f} {v['p10_us']:>9.1f} {v['p90_us']:>9.1f}")
    print(f"{'kernel run (first 12)':<60} {'orig us':>8} {'repl us':>8}")
    for r in report["per_kernel_run_us"]:
        print(f"{r['kernel'][:60]:<60} {r['original']:>8.2f} {r['replacement']:>8.2f}")
    print("own time, replacements minus originals, per forward (us):")
    for r in report["profile_own_time_delta_us_per_forward"][:8]:
        print(f"  {r['delta_us']:>8.2f}  {r['function'][:90]}  calls {r['calls_per_forward']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("problem")
    ap.add_argument("out")
    ap.add_argument("--size", default="large")
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    if a.calls < 12:
        ap.error(f"--calls must be at least 12, got {a.calls}")
    import torch

    from kforge.inspect.capture import load_sized
    from kforge.inspect.inductor import WrapperHook, launcher_kinds
    from kforge.inspect.restitch import compile_problem, swapping

    kind, problem = load_sized(a.problem, a.size)
    if kind != "problem":
        ap.error(f"{a.problem} is not a KernelBench-format problem")
    dev = torch.device("cuda")
    _model, compiled, inputs = compile_problem(problem, "default", dev)
    with torch.no_grad():
        with WrapperHook() as hook:
            compiled(*inputs)
        torch.cuda.synchronize()
        pairs, unpinned = replaced_pairs(hook.modules)
        forward = lambda: compiled(*inputs)  # noqa: E731
        originals, replacements = swapping(pairs, forward)
        plain = {"originals": originals, "replacements": replacements}
        for fn in plain.values():
            for _ in range(5):
                fn()
        forward_host = {k: summary(v) for k, v in host_blocks(torch, plain, a.calls).items()}
        # The same forward without the swaps' setattr calls: the originals set once, left in place.
        originals()
        forward_host["originals_no_setattr"] = summary(host_blocks(torch, {"x": forward}, a.calls)["x"])
        per_kernel = per_kernel_run(torch, pairs, recorded_args(torch, pairs, originals))
        calls_n = max(20, a.calls // 5)
        prof = {k: profiled(fn, calls_n) for k, fn in plain.items()}
    report = {
        "problem": a.problem, "size": a.size, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "kernels_replaced": len(pairs), "unpinned": unpinned,
        "launchers": {"original": launcher_kinds([p[2] for p in pairs]), "replacement": launcher_kinds([p[3] for p in pairs])},
        "forward_host": forward_host, "per_kernel_run_us": per_kernel,
        "profile_own_time_delta_us_per_forward": own_time_deltas(prof, calls_n),
        "differing_attributes": {name: differing_attributes(old, new) for _m, name, old, new in pairs[:5]},
    }
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
