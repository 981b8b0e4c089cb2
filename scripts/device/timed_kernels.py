"""Time the DESIGN-NOTES §1 kernels with kforge.do_bench (bf16 4096^3 matmul, x*2 over 256 MB fp32).

Usage: python3 timed_kernels.py LABEL OUT.json
Writes median/p95 per kernel (ms) and the raw samples.
"""
from __future__ import annotations

import json
import os
import sys
import time

import torch

import kforge
from kforge.bench import quantile


def q(xs: list[float], p: float) -> float:
    return quantile(xs, p)


def main() -> None:
    label, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64 * 1024 * 1024, device="cuda", dtype=torch.float32)  # 256 MB
    ref = (a.float() @ b.float())
    got = (a @ b).float()
    rel = ((got - ref).norm() / ref.norm()).item()
    assert rel < 1e-2, f"matmul wrong: rel err {rel}"
    assert torch.equal(x * 2, x + x)
    res: dict[str, object] = {"label": label, "matmul_rel_err": rel}
    # Optional start signal: set up (CUDA context, tensors, check) first, then wait for the file
    # to appear, so a measurement can start right after an event of the calling script.
    go = os.environ.get("KFORGE_TIMED_GO_FILE")
    if go:
        open(go + ".ready", "w").close()
        while not os.path.exists(go):
            time.sleep(0.01)
    for name, fn in (("matmul_bf16_4096", lambda: a @ b), ("elementwise_x2_256MB", lambda: x * 2)):
        t_start = time.time()
        samples = kforge.do_bench(fn, warmup=50, rep=300, return_mode="all", name=f"{label}:{name}")
        res[name] = {"median_ms": q(samples, 0.5), "p95_ms": q(samples, 0.95), "n": len(samples), "samples_ms": samples,
                     "t_start": t_start, "t_end": time.time()}
        print(f"{label:<16} {name:<22} median {q(samples, 0.5):.4f} ms  p95 {q(samples, 0.95):.4f} ms  n={len(samples)}", flush=True)
    with open(out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
