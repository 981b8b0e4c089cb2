"""Each rewrite rule of kforge.optimize.rewrite on the GPU: the original forward against the
rewritten one, eager and under torch.compile (default mode), fp32 without TF32; interleaved
rounds (original, rewritten, original, ...), the median of each round's per-call time by CUDA
events, the ratio as the median over rounds; the outputs checked against the rule's class
tolerance. Writes $OUT/rewrite-rules.json and prints a table. ``--device cpu --size N`` runs the
same on the CPU at a smaller size (a check of the script, with host timers; not a benchmark).

    PYTHONPATH=python python3 scripts/device/rewrite_rules.py [--no-compile] [--device cpu] [--size 4096]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Sequence

import torch
import torch.nn as nn

from kforge.optimize import rewrite as rw

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def option(name: str, default: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default


DEV = option("--device", "cuda")
SIZE = int(option("--size", "4096"))


class Fn(nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn


def fn_model(fn: Callable[[Any, Any], Any]) -> nn.Module:
    class Two(Fn):
        def forward(self, a: Any, b: Any) -> Any:
            return self.fn(a, b)

    return Two(fn)


class LinearSum(nn.Module):
    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.fc = nn.Linear(k, n)

    def forward(self, x: Any, unused: Any) -> Any:
        return self.fc(x).sum(-1)


def cases() -> List[Dict[str, Any]]:
    r = lambda *s: torch.randn(*s, device=DEV)  # noqa: E731
    n = SIZE
    return [
        {"case": f"diag(a) @ B, {n}", "model": fn_model(lambda a, b: torch.diag(a) @ b), "inputs": [r(n), r(n, n)]},
        {"case": f"A @ diag(b), {n}", "model": fn_model(lambda a, b: b @ torch.diag(a)), "inputs": [r(n), r(n, n)]},
        {"case": f"diag(A @ B), {n}", "model": fn_model(lambda a, b: torch.diag(a @ b)), "inputs": [r(n, n), r(n, n)]},
        {"case": f"linear(x).sum(-1), {n}x{n} -> {n}", "model": LinearSum(n, n).to(DEV),
         "inputs": [r(n, n), r(1)]},
        {"case": f"linear(x).sum(-1), 128x{n} -> {n}", "model": LinearSum(n, n).to(DEV), "inputs": [r(128, n), r(1)]},
        {"case": f"tril(A) @ tril(B), {n}", "model": fn_model(lambda a, b: torch.tril(a) @ torch.tril(b)),
         "inputs": [r(n, n), r(n, n)]},
        {"case": f"tril(tril(A) @ tril(B)), {n}",
         "model": fn_model(lambda a, b: torch.tril(torch.tril(a) @ torch.tril(b))), "inputs": [r(n, n), r(n, n)]},
        {"case": f"tril(tril(A) @ tril(B)), {2 * n}",
         "model": fn_model(lambda a, b: torch.tril(torch.tril(a) @ torch.tril(b))),
         "inputs": [r(2 * n, 2 * n), r(2 * n, 2 * n)]},
        {"case": f"triu(A) @ triu(B), {n // 2}", "model": fn_model(lambda a, b: torch.triu(a) @ torch.triu(b)),
         "inputs": [r(n // 2, n // 2), r(n // 2, n // 2)]},
    ]


def sync() -> None:
    if DEV != "cpu":
        torch.cuda.synchronize()


def per_call_ms(f: Callable[[], Any], reps: int) -> float:
    if DEV == "cpu":
        t0 = time.perf_counter()
        for _ in range(reps):
            f()
        return (time.perf_counter() - t0) * 1e3 / reps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        f()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end)) / reps


def interleaved(a: Callable[[], Any], b: Callable[[], Any], rounds: int = 15) -> Dict[str, float]:
    for _ in range(3):
        a(), b()
    sync()
    t0 = time.perf_counter()
    a()
    sync()
    reps = max(3, min(200, int(0.05 / max(time.perf_counter() - t0, 1e-6))))
    ta: List[float] = []
    tb: List[float] = []
    ratios: List[float] = []
    for _ in range(rounds):
        x, y = per_call_ms(a, reps), per_call_ms(b, reps)
        ta.append(x)
        tb.append(y)
        ratios.append(x / y)
    return {"original_ms": statistics.median(ta), "rewritten_ms": statistics.median(tb),
            "speedup": statistics.median(ratios), "reps": reps}


def within(model: Any, gm: Any, inputs: Sequence[Any], exactness: str) -> Dict[str, Any]:
    with torch.no_grad():
        ref, out = model(*inputs), gm(*inputs)
        rtol, atol = rw.tolerance(exactness, ref.dtype)
        ok = bool(torch.equal(out, ref)) if rtol == atol == 0.0 else bool(torch.allclose(out, ref, rtol=rtol, atol=atol))
        return {"ok": ok, "max_abs_diff": float((out.double() - ref.double()).abs().max())}


def main() -> int:
    compile_too = "--no-compile" not in sys.argv
    rows: List[Dict[str, Any]] = []
    for c in cases():
        model, inputs = c["model"], c["inputs"]
        res = rw.rewrite_model(model, inputs)
        gm = res.module
        row: Dict[str, Any] = {"case": c["case"], "rules": [a.rule for a in res.applications],
                               "exactness": res.exactness, "check": within(model, gm, inputs, res.exactness)}
        with torch.no_grad():
            row["eager"] = interleaved(lambda: model(*inputs), lambda: gm(*inputs))
            if compile_too:
                cm, cg = torch.compile(model), torch.compile(gm)
                row["compiled"] = interleaved(lambda: cm(*inputs), lambda: cg(*inputs))
        rows.append(row)
        print(json.dumps(row), flush=True)
        del model, inputs, gm, res
        if DEV != "cpu":
            torch.cuda.empty_cache()
    out = {"device": torch.cuda.get_device_name() if DEV != "cpu" else "cpu", "size": SIZE, "torch": torch.__version__, "tf32": False, "rows": rows}
    path = os.path.join(os.environ.get("OUT", "."), "rewrite-rules.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"{'case':42} {'rules':40} {'check':6} {'eager':>8} {'compiled':>8}")
    for row in rows:
        comp = f"{row['compiled']['speedup']:.2f}x" if "compiled" in row else "-"
        print(f"{row['case']:42} {','.join(row['rules']):40} {str(row['check']['ok']):6} "
              f"{row['eager']['speedup']:7.2f}x {comp:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
