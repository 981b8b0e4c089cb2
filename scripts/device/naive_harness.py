"""A naive single-seed harness, as a user would write one (KernelBench's eval, trimmed): load the
problem at a size preset, build the reference and the candidate, one input set, allclose, then
triton.testing.do_bench of both. The yardstick `kforge verify`'s wall time is compared with
(scripts/device/verify_scale.sh).

    python3 naive_harness.py PROBLEM CANDIDATE [--size large] [--inputs host|device]

--inputs host: get_inputs() on the CPU, then .cuda() (what KernelBench's eval does);
--inputs device: get_inputs() with CUDA as the default device (the fastest a naive harness gets).
Prints one JSON line: correct, max_abs_diff, ref_ms, new_ms, seconds per phase. fp32 is strict
fp32 (TF32 off for cuDNN and cuBLAS), as in every process `kforge verify` starts, so both time
the same arithmetic."""
import argparse
import importlib.util
import json
import time

import torch
import triton.testing


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("problem")
    ap.add_argument("candidate")
    ap.add_argument("--size", default="large")
    ap.add_argument("--inputs", default="host", choices=("host", "device"))
    a = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    t = {"start": time.perf_counter()}
    p = load(a.problem, "problem")
    if a.size == "large":
        for k, v in p.LARGE.items():
            setattr(p, k, v)
    c = load(a.candidate, "candidate")
    torch.manual_seed(0)
    init = p.get_init_inputs()
    ref = p.Model(*init).cuda().eval()
    new = c.ModelNew(*init).cuda().eval()
    new.load_state_dict(ref.state_dict(), strict=False)
    t["built"] = time.perf_counter()
    if a.inputs == "host":
        xs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in p.get_inputs()]
    else:
        with torch.device("cuda"):
            xs = p.get_inputs()
    torch.cuda.synchronize()
    t["inputs"] = time.perf_counter()
    with torch.no_grad():
        expected = ref(*xs)
        got = new(*xs)
        tol = 1e-2 if expected.dtype in (torch.float16, torch.bfloat16) else 1e-4
        correct = bool(torch.allclose(got, expected, rtol=tol, atol=tol))
        diff = float((got.float() - expected.float()).abs().max())
        del got, expected
        t["checked"] = time.perf_counter()
        ref_ms = triton.testing.do_bench(lambda: ref(*xs))
        new_ms = triton.testing.do_bench(lambda: new(*xs))
    t["timed"] = time.perf_counter()
    phases = {k: round(t[k] - t[prev], 3) for prev, k in zip(["start", "built", "inputs", "checked"], ["built", "inputs", "checked", "timed"])}
    print(json.dumps({"correct": correct, "max_abs_diff": diff, "ref_ms": ref_ms, "new_ms": new_ms, "phases_s": phases}))


if __name__ == "__main__":
    main()
