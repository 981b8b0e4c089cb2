"""Launch-bound loop for the shim's overhead (issue 3): N tiny kernels, wall time per launch.

Usage: python3 shim_overhead.py N OUT.json
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch


def main() -> None:
    n, out = int(sys.argv[1]), sys.argv[2]
    x = torch.zeros(1, device="cuda")
    for _ in range(1000):
        x.add_(1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    assert x.item() == n + 1000, x.item()
    res = {"n": n, "seconds": dt, "us_per_launch": dt / n * 1e6, "preload": os.environ.get("LD_PRELOAD", ""), "gate": os.environ.get("KFORGE_GATE", "")}
    print(json.dumps(res))
    with open(out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
