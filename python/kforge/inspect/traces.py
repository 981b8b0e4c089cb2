"""torch.profiler traces of a compiled model for ``kforge inspect``: the kernels of each profiled
iteration, and what differs per call between two runs of a model (device work by name, host time).

torch is imported inside the functions that use it (the capture's entry point must start without
torch, to report its absence).
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from typing import Any, Callable, Dict, List, Sequence

from ..bench import probe_host_us
from ..region import region


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


def explain_difference(base: Dict[str, Dict[str, float]], new: Dict[str, Dict[str, float]],
                       base_host_us: float, new_host_us: float, top: int = 6) -> Dict[str, Any]:
    """What differs between two runs of a model, per call: device work by name (launches that
    only one side makes, and time), and host time. ``why``: one line, largest differences first —
    the reason a round trip is beyond noise, in its table."""
    rows: List[Dict[str, Any]] = []
    for name in sorted(set(base) | set(new)):
        b, n = base.get(name, {"count": 0.0, "us": 0.0}), new.get(name, {"count": 0.0, "us": 0.0})
        rows.append({"name": name, "base_count": round(b["count"], 2), "new_count": round(n["count"], 2),
                     "base_us": round(b["us"], 2), "new_us": round(n["us"], 2), "delta_us": round(n["us"] - b["us"], 2)})
    # Launches only one side makes (or makes more often) first, then by the time they differ.
    rows.sort(key=lambda r: (r["base_count"] == r["new_count"], -abs(r["delta_us"])))
    dev_b, dev_n = sum(r["base_us"] for r in rows), sum(r["new_us"] for r in rows)
    parts = []
    host_delta = new_host_us - base_host_us
    if abs(host_delta) > 0.02 * max(base_host_us, 1.0):
        parts.append(f"host {host_delta:+.0f} µs/call ({base_host_us:.0f} → {new_host_us:.0f})")
    if abs(dev_n - dev_b) > 0.005 * max(dev_b, 1.0):
        parts.append(f"device {dev_n - dev_b:+.1f} µs/call ({dev_b:.1f} → {dev_n:.1f})")
    notable = [r for r in rows if r["base_count"] != r["new_count"] or abs(r["delta_us"]) >= max(1.0, 0.005 * dev_b)]
    for r in notable[:top]:
        short = r["name"] if len(r["name"]) <= 48 else r["name"][:45] + "..."
        count = "" if r["base_count"] == r["new_count"] else f" ×{r['base_count']:g}→{r['new_count']:g}"
        parts.append(f"{short}{count} {r['delta_us']:+.1f} µs")
    return {"why": "; ".join(parts) or "no difference in device work or host time per call",
            "host_us": {"base": round(base_host_us, 1), "new": round(new_host_us, 1)},
            "device_us": {"base": round(dev_b, 1), "new": round(dev_n, 1)}, "by_name": rows[:20]}


def profile_pair(base: Callable[[], Any], new: Callable[[], Any], calls: int = 3) -> Dict[str, Any]:
    """Device work per call of two runs of a model (torch.profiler, each alone) and their host
    time (median of ``do_bench``'s host probe: 5 calls, the GPU idle before each), compared by
    :func:`explain_difference`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    totals = []
    with region("inspect:round-trip-profile"):
        hosts = [statistics.median(probe_host_us(torch, fn, None)) for fn in (base, new)]
        for fn in (base, new):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize()
            totals.append(device_totals(trace_events(prof), calls))
    return explain_difference(totals[0], totals[1], hosts[0], hosts[1])
