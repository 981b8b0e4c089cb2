"""Time every suite problem's eager forward at both size presets on the GPU: the measurement
behind problems/README.md's large-preset estimates.

    python3 scripts/device/large_preset_times.py OUT.json [GLOB...]

Per problem and preset: inputs made on the GPU (get_inputs with CUDA as the default device), the
reference built there, one forward, then triton.testing.do_bench of the forward (median ms), the
input + parameter bytes and the peak memory one forward allocated (torch's allocator). A problem
that fails records the error's last line. Strict fp32 (TF32 off for cuDNN and cuBLAS), as in
every process kforge starts for a problem. Prints a table last."""
import glob
import importlib.util
import json
import os
import sys
import time

import torch
import triton.testing


def load(path):
    spec = importlib.util.spec_from_file_location("p_" + os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def one(path, size):
    p = load(path)
    if size == "large":
        for k, v in p.LARGE.items():
            setattr(p, k, v)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = p.Model(*p.get_init_inputs()).eval()
        xs = p.get_inputs()
    in_bytes = sum(x.numel() * x.element_size() for x in xs if isinstance(x, torch.Tensor))
    in_bytes += sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    with torch.no_grad():
        model(*xs)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        ms = triton.testing.do_bench(lambda: model(*xs), warmup=25, rep=200)
    return {"ms": ms, "input_param_bytes": in_bytes, "forward_peak_bytes": peak}


def main():
    out = sys.argv[1]
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    paths = sorted(p for g in (sys.argv[2:] or ["problems/level*/*.py"]) for p in glob.glob(g))
    rows = []
    for path in paths:
        for size in ("default", "large"):
            t0 = time.perf_counter()
            try:
                r = one(path, size)
            except Exception as e:
                r = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
            r.update(problem=path, size=size, seconds=round(time.perf_counter() - t0, 2))
            rows.append(r)
            torch.cuda.empty_cache()
            print(json.dumps(r), file=sys.stderr, flush=True)
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, open(out, "w"), indent=1)
    print("%-48s %10s %10s %9s %9s" % ("PROBLEM", "DEFAULT ms", "LARGE ms", "IN GiB", "PEAK GiB"))
    by = {}
    for r in rows:
        by.setdefault(r["problem"], {})[r["size"]] = r
    for path, d in by.items():
        dl, lg = d.get("default", {}), d.get("large", {})
        print("%-48s %10s %10s %9s %9s" % (path.replace("problems/", ""), "%.3f" % dl["ms"] if "ms" in dl else "ERR",
              "%.3f" % lg["ms"] if "ms" in lg else "ERR", "%.2f" % (lg.get("input_param_bytes", 0) / 2**30),
              "%.2f" % (lg.get("forward_peak_bytes", 0) / 2**30)))


if __name__ == "__main__":
    main()
