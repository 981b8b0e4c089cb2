"""torch.profiler traces of a compiled model for ``kforge inspect``: the kernels of each profiled
iteration, and what differs per call between two runs of a model (device work by name, host time).

torch is imported inside the functions that use it (the capture's entry point must start without
torch, to report its absence).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..harness import MEDIAN_SE, t95
from ..region import region

# The paired host probe of two runs (`paired_host_us`): at least this many pairs of calls, more
# while within HOST_PROBE_S, at most HOST_PAIRS_MAX.
HOST_PAIRS_MIN = 15
HOST_PAIRS_MAX = 201
HOST_PROBE_S = 1.0


def group_iterations(events: Sequence[Dict[str, Any]], iterations: int) -> List[List[Dict[str, Any]]]:
    """Split a chrome trace's events into per-iteration kernel lists.

    Kernels (``cat == "kernel"``) are grouped by the GPU-side ``kforge_iter_N`` annotations that
    contain them; else by the CPU-side ``kforge_iter_N`` range containing their launch (matched
    through the correlation id); else, sorted by start, split into equal parts (the capture
    synchronizes after every iteration, so each iteration's kernels are contiguous).
    """
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: float(e.get("ts", 0)))
    marks = sorted(
        (e for e in events if e.get("cat") == "gpu_user_annotation" and str(e.get("name", "")).startswith("kforge_iter_")),
        key=lambda e: float(e.get("ts", 0)),
    )
    out: List[List[Dict[str, Any]]] = []
    if not kernels:
        return out

    def ev(k: Dict[str, Any]) -> Dict[str, Any]:
        return {"name": k["name"], "dur_us": float(k.get("dur", 0))}

    if len(marks) == iterations:
        for m in marks:
            lo, hi = float(m["ts"]), float(m["ts"]) + float(m.get("dur", 0))
            out.append([ev(k) for k in kernels if lo <= float(k["ts"]) <= hi])
        return out
    # Inductor wraps each compiled call in its own record_function, so the GPU-side annotations
    # may name that instead: map each kernel to the CPU-side kforge_iter_N range through the
    # launch (runtime) event with the same correlation id.
    cpu_marks = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("kforge_iter_")),
        key=lambda e: float(e.get("ts", 0)),
    )
    launch_ts = {e.get("args", {}).get("correlation"): float(e.get("ts", 0))
                 for e in events if e.get("cat") == "cuda_runtime" and e.get("args", {}).get("correlation") is not None}
    if len(cpu_marks) == iterations and launch_ts:
        groups: List[List[Dict[str, Any]]] = [[] for _ in cpu_marks]
        placed = 0
        for k in kernels:
            t = launch_ts.get(k.get("args", {}).get("correlation"))
            if t is None:
                continue
            for i, m in enumerate(cpu_marks):
                if float(m["ts"]) <= t <= float(m["ts"]) + float(m.get("dur", 0)):
                    groups[i].append(ev(k))
                    placed += 1
                    break
        if placed:
            return groups
    if iterations <= 0 or len(kernels) % iterations != 0:
        return [[ev(k) for k in kernels]]
    per = len(kernels) // iterations
    for i in range(iterations):
        out.append([ev(k) for k in kernels[i * per:(i + 1) * per]])
    return out


def trace_events(prof: Any) -> List[Dict[str, Any]]:
    """The events of a finished torch.profiler run, through its chrome-trace export."""
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "trace.json")
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            return list(json.load(f).get("traceEvents", []))


#: Trace categories of device work: kernels, copies, memsets.
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def device_totals(events: Sequence[Dict[str, Any]], calls: int) -> Dict[str, Dict[str, float]]:
    """Per name of device work in a trace of ``calls`` calls: launches and microseconds per call."""
    out: Dict[str, Dict[str, float]] = {}
    for e in events:
        if e.get("cat") in DEVICE_CATEGORIES:
            t = out.setdefault(str(e.get("name", "?")), {"count": 0.0, "us": 0.0})
            t["count"] += 1.0 / calls
            t["us"] += float(e.get("dur", 0)) / calls
    return out


def paired_host_us(sync: Callable[[], Any], base: Callable[[], Any], new: Callable[[], Any],
                   clock: Callable[[], float] = time.perf_counter, budget_s: float = HOST_PROBE_S) -> Dict[str, Any]:
    """Host time per call of two runs of a model, paired: the calls alternate (each pair's order
    the other way round from the last's), the GPU idle before each (``sync``), at least
    HOST_PAIRS_MIN pairs and more while within ``budget_s``. ``delta_us`` is the median of the
    pairs' differences new - base, ``half_us`` the half width of its 95 % interval (the median's
    standard error, ``MEDIAN_SE`` × sd / √n, times t): two medians of a few calls each do not
    say which side is slower where the host's speed moves in phases (session 32, the large LSTM:
    a 5-call probe read -707 µs a call where the round trip measured +150 µs)."""
    sides: Dict[str, List[float]] = {"base": [], "new": []}
    fns = {"base": base, "new": new}
    started = clock()
    pairs = 0
    while pairs < HOST_PAIRS_MAX and (pairs < HOST_PAIRS_MIN or clock() - started < budget_s):
        for name in (("base", "new") if pairs % 2 == 0 else ("new", "base")):
            sync()
            t0 = clock()
            fns[name]()
            sides[name].append((clock() - t0) * 1e6)
        pairs += 1
    sync()
    deltas = [n - b for b, n in zip(sides["base"], sides["new"])]
    sd = statistics.stdev(deltas) if len(deltas) > 1 else 0.0
    return {"base_us": statistics.median(sides["base"]), "new_us": statistics.median(sides["new"]),
            "delta_us": statistics.median(deltas), "half_us": t95(len(deltas)) * MEDIAN_SE * sd / math.sqrt(len(deltas)),
            "pairs": pairs}


def explain_difference(base: Dict[str, Dict[str, float]], new: Dict[str, Dict[str, float]],
                       base_host_us: float, new_host_us: float, top: int = 6,
                       host_delta: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """What differs between two runs of a model, per call: device work by name (launches that
    only one side makes, and time), and host time. ``why``: one line, largest differences first —
    the reason a round trip is beyond noise, in its table. ``host_delta`` (``paired_host_us``):
    the host difference is its paired one, named only beyond its own interval."""
    rows: List[Dict[str, Any]] = []
    for name in sorted(set(base) | set(new)):
        b, n = base.get(name, {"count": 0.0, "us": 0.0}), new.get(name, {"count": 0.0, "us": 0.0})
        rows.append({"name": name, "base_count": round(b["count"], 2), "new_count": round(n["count"], 2),
                     "base_us": round(b["us"], 2), "new_us": round(n["us"], 2), "delta_us": round(n["us"] - b["us"], 2)})
    # Launches only one side makes (or makes more often) first, then by the time they differ.
    rows.sort(key=lambda r: (r["base_count"] == r["new_count"], -abs(r["delta_us"])))
    dev_b, dev_n = sum(r["base_us"] for r in rows), sum(r["new_us"] for r in rows)
    parts = []
    delta = host_delta["delta_us"] if host_delta else new_host_us - base_host_us
    half = host_delta["half_us"] if host_delta else 0.0
    if abs(delta) > max(0.02 * max(base_host_us, 1.0), half):
        within = f", ±{half:.0f} paired" if host_delta else ""
        parts.append(f"host {delta:+.0f} µs/call ({base_host_us:.0f} → {new_host_us:.0f}{within})")
    if abs(dev_n - dev_b) > 0.005 * max(dev_b, 1.0):
        parts.append(f"device {dev_n - dev_b:+.1f} µs/call ({dev_b:.1f} → {dev_n:.1f})")
    notable = [r for r in rows if r["base_count"] != r["new_count"] or abs(r["delta_us"]) >= max(1.0, 0.005 * dev_b)]
    for r in notable[:top]:
        short = r["name"] if len(r["name"]) <= 48 else r["name"][:45] + "..."
        count = "" if r["base_count"] == r["new_count"] else f" ×{r['base_count']:g}→{r['new_count']:g}"
        parts.append(f"{short}{count} {r['delta_us']:+.1f} µs")
    return {"why": "; ".join(parts) or "no difference in device work or host time per call",
            "host_us": {"base": round(base_host_us, 1), "new": round(new_host_us, 1),
                        **({"delta": round(delta, 1), "half": round(half, 1), "pairs": host_delta["pairs"]}
                           if host_delta else {})},
            "device_us": {"base": round(dev_b, 1), "new": round(dev_n, 1)}, "by_name": rows[:20]}


def profile_pair(base: Callable[[], Any], new: Callable[[], Any], calls: int = 3) -> Dict[str, Any]:
    """Device work per call of two runs of a model (torch.profiler, each alone) and their host
    time (``paired_host_us``: calls alternating, the GPU idle before each), compared by
    :func:`explain_difference`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    totals = []
    with region("inspect:round-trip-profile"):
        host = paired_host_us(torch.cuda.synchronize, base, new)
        for fn in (base, new):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize()
            totals.append(device_totals(trace_events(prof), calls))
    return explain_difference(totals[0], totals[1], host["base_us"], host["new_us"], host_delta=host)
