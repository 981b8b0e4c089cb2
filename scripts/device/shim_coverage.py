"""Coverage of the gate shim on real workloads (issue 3).

Usage: python3 shim_coverage.py MODE OUT_PREFIX
MODE: eager | cublas | triton | compile-default | compile-reduce-overhead

Runs the workload once to warm up, then once more under torch.profiler. Writes
OUT_PREFIX.json with the launches the profiler saw (CUDA runtime/driver launch API calls and GPU
kernels) and, when the shim is preloaded, the launches the shim counted over the same section
(kforge_shim_launch_count before/after), and OUT_PREFIX.pt with the outputs (for bit-identity).
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import sys
from typing import Callable

import torch
import torch.nn.functional as F

LAUNCH_APIS = {
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
    "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
    "cudaGraphLaunch", "cuGraphLaunch",
}


def shim_count() -> int | None:
    try:
        f = ctypes.CDLL(None).kforge_shim_launch_count
    except AttributeError:
        return None
    f.restype = ctypes.c_uint64
    return int(f())


def workload(mode: str) -> Callable[[], torch.Tensor]:
    torch.manual_seed(0)
    dev = "cuda"
    if mode == "eager":
        x = torch.randn(1 << 20, device=dev)
        def run() -> torch.Tensor:
            y = torch.relu(x) * 2 + 1
            y = torch.softmax(y.view(1024, 1024), dim=-1)
            z = y.sum(dim=0) + y.mean() + torch.sigmoid(y).amax()
            return torch.cat([z, torch.cumsum(z, 0)])
        return run
    if mode == "cublas":
        a = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)
        b = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)
        return lambda: (a @ b) @ b
    if mode == "triton":
        import triton
        import triton.language as tl

        @triton.jit
        def axpy(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
            pid = tl.program_id(0)
            offs = pid * BLOCK + tl.arange(0, BLOCK)
            m = offs < n
            tl.store(out_ptr + offs, 3.0 * tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)

        x = torch.randn(1 << 22, device=dev)
        y = torch.randn(1 << 22, device=dev)
        out = torch.empty_like(x)
        def run() -> torch.Tensor:
            for _ in range(20):
                axpy[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
            return out.clone()
        return run
    if mode.startswith("compile"):
        m = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024), torch.nn.LayerNorm(1024)).to(dev)
        x = torch.randn(512, 1024, device=dev)
        cm = torch.compile(m, mode="reduce-overhead" if mode.endswith("reduce-overhead") else "default")
        def run() -> torch.Tensor:
            with torch.no_grad():
                return cm(x).clone()
        return run
    raise SystemExit(f"unknown mode {mode!r}")


def main() -> None:
    mode, prefix = sys.argv[1], sys.argv[2]
    run = workload(mode)
    for _ in range(3):  # warm up: compile, autotune, capture graphs
        out = run()
    torch.cuda.synchronize()
    before = shim_count()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = run()
        torch.cuda.synchronize()
    after = shim_count()
    api = 0
    kernels = 0
    for e in prof.events():
        if e.name in LAUNCH_APIS:
            api += 1
        elif getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA and not e.name.startswith("Memcpy") and not e.name.startswith("Memset"):
            kernels += 1
    res = {
        "mode": mode,
        "profiler_launch_api_calls": api,
        "profiler_gpu_kernels": kernels,
        "shim_launches": None if before is None else after - before,
        "output_sha256": hashlib.sha256(out.detach().float().cpu().numpy().tobytes()).hexdigest(),
    }
    print(json.dumps(res))
    with open(prefix + ".json", "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
