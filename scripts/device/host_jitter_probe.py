"""Issue 17 item 6: why a launch-bound call's host time moves by up to 2x in phases of about a
second on the device machines (the noise floor's rounds of session 31), and whether the core a
region pins its measuring thread to (the daemon's reserved cpu, 0 by default) matters.

    python3 scripts/device/host_jitter_probe.py OUT.json

No daemon, no kforge: the main thread pinned to one cpu at a time (cpus 0, 1, the middle one and
the last, and unpinned), blocks interleaved over rounds, each block timing calls of two kinds:
  - launches: 20 tiny CUDA kernels (an in-place add on 1024 floats), the GPU idle before each call
    (a synchronize), host time by perf_counter (as kforge.bench's count_host samples a call);
  - python: a fixed pure-Python loop (no CUDA), the vCPU's own speed.
Per block: the calls' median, p10 and p90, and the cpu's steal and irq time over the block from
/proc/stat (USER_HZ ticks). Then one long run on cpu 0 (the timeline of launch calls in order)
to see the phases (5 s of calls). Prints the machine (kernel, cpu model, cpufreq governor if any, where the
interrupts go) and a table last.
"""

from __future__ import annotations

import json
import os
import platform
import statistics as st
import sys
import time
from typing import Any, Dict, List


def proc_stat() -> Dict[str, List[int]]:
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu"):
                parts = line.split()
                out[parts[0]] = [int(x) for x in parts[1:]]
    return out


def interrupts_per_cpu() -> List[int]:
    try:
        with open("/proc/interrupts") as f:
            ncpu = len(f.readline().split())
            sums = [0] * ncpu
            for line in f:
                parts = line.split()
                for i in range(ncpu):
                    if i + 1 < len(parts) and parts[i + 1].isdigit():
                        sums[i] += int(parts[i + 1])
            return sums
    except OSError:
        return []


def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "-"


def q(xs: List[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


def group_medians(xs: List[float], w: int) -> List[float]:
    """Medians of consecutive groups of ``w`` values (a last partial group left out)."""
    return [st.median(xs[i:i + w]) for i in range(0, len(xs) - w + 1, w)]


def main(out_path: str) -> int:
    import torch

    cpus = sorted(os.sched_getaffinity(0))
    picks = sorted({cpus[0], cpus[1], cpus[len(cpus) // 2], cpus[-1]})
    machine = {
        "kernel": platform.release(), "cpus": len(cpus),
        "model": next((l.split(":", 1)[1].strip() for l in read("/proc/cpuinfo").splitlines() if l.startswith("model name")), "-"),
        "governor": read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
        "cur_khz": read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq"),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU tensors: a smoke run)",
        "torch": torch.__version__,
        "irqs_per_cpu_at_start": interrupts_per_cpu(),
    }
    print(json.dumps({k: v for k, v in machine.items() if k != "irqs_per_cpu_at_start"}))
    cuda = torch.cuda.is_available()
    x = torch.zeros(1024, device="cuda" if cuda else "cpu")

    def launches() -> None:
        for _ in range(20):
            x.add_(1.0)

    def python_work() -> None:
        s = 0
        for i in range(2000):
            s += i * i

    def one(fn: Any, sync: bool) -> float:
        if sync and cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        return (t1 - t0) * 1e6

    for _ in range(200):
        one(launches, True)
    blocks: List[Dict[str, Any]] = []
    deadline = time.monotonic() + float(os.environ.get("PROBE_S", "25"))
    rnd = 0
    while time.monotonic() < deadline and rnd < 30:
        for cpu in picks + [None]:
            os.sched_setaffinity(0, {cpu} if cpu is not None else set(cpus))
            key = f"cpu{cpu}" if cpu is not None else "cpu"
            before, t0 = proc_stat(), time.monotonic()
            la = [one(launches, True) for _ in range(600)]
            py = [one(python_work, False) for _ in range(300)]
            after, dt = proc_stat(), time.monotonic() - t0
            d = [a - b for a, b in zip(after[key], before[key])]  # user nice system idle iowait irq softirq steal
            blocks.append({"round": rnd, "cpu": cpu, "seconds": dt,
                           "launch_us": [st.median(la), q(la, 0.1), q(la, 0.9)],
                           "python_us": [st.median(py), q(py, 0.1), q(py, 0.9)],
                           "ticks": {"irq": d[5], "softirq": d[6], "steal": d[7] if len(d) > 7 else None,
                                     "busy": d[0] + d[1] + d[2]}})
        rnd += 1
    os.sched_setaffinity(0, {cpus[0]})
    timeline: List[float] = []
    end = time.monotonic() + 5.0
    while time.monotonic() < end:
        timeline.append(one(launches, True))
    os.sched_setaffinity(0, set(cpus))
    machine["irqs_per_cpu_at_end"] = interrupts_per_cpu()
    with open(out_path, "w") as f:
        json.dump({"machine": machine, "blocks": blocks, "timeline_calls": len(timeline),
                   "timeline_cpu0_medians_of_50_us": [round(m, 1) for m in group_medians(timeline, 50)]}, f)
    irq_delta = [a - b for a, b in zip(machine["irqs_per_cpu_at_end"], machine["irqs_per_cpu_at_start"])]
    print("interrupts per cpu during the probe:", irq_delta)
    print(f"{'cpu':>5} {'blocks':>6} {'launch med':>10} {'range of block medians':>24} {'p90/p10 med':>11} "
          f"{'python med':>10} {'range':>16} {'steal':>6} {'irq+soft':>8}")
    for cpu in picks + [None]:
        bs = [b for b in blocks if b["cpu"] == cpu]
        lm = [b["launch_us"][0] for b in bs]
        pm = [b["python_us"][0] for b in bs]
        spread = st.median([b["launch_us"][2] / b["launch_us"][1] for b in bs])
        steal = sum(b["ticks"]["steal"] or 0 for b in bs)
        irq = sum(b["ticks"]["irq"] + b["ticks"]["softirq"] for b in bs)
        print(f"{'all' if cpu is None else cpu:>5} {len(bs):>6} {st.median(lm):>10.1f} {min(lm):>11.1f}-{max(lm):<11.1f} "
              f"{spread:>11.3f} {st.median(pm):>10.1f} {min(pm):>7.1f}-{max(pm):<8.1f} {steal:>6} {irq:>8}")
    w = max(1, len(timeline) // 60)
    print(f"cpu0 timeline, {len(timeline)} calls in 5 s, medians of {w} calls in order (us):",
          " ".join(f"{m:.0f}" for m in group_medians(timeline, w)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "host_jitter_probe.json"))
