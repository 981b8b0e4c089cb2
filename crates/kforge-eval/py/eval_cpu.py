"""CPU candidates for the kforge runtime evaluation (runs anywhere: Python 3.8+, stdlib only).

Usage: python3 eval_cpu.py SPEC_JSON
SPEC_JSON keys: id, operator (crc | hash | sum), size {"n": bytes or elements}, params
{"variant": ...}, seed. Untimed: random input, a correctness check; timed: the candidate with
kforge.do_bench inside a region. Prints `RESULT {"id": ..., "median_ms": ...}`.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import zlib
from typing import Any, Callable, Dict

import kforge


def build(spec: Dict[str, Any]) -> "tuple[Callable[[], Any], Callable[[], Any]]":
    """(candidate, reference) callables for a spec."""
    op, n, variant = spec["operator"], int(spec["size"]["n"]), spec["params"]["variant"]
    rng = random.Random(int(spec["seed"]))
    if op == "crc":
        data = rng.randbytes(n) if hasattr(rng, "randbytes") else bytes(rng.getrandbits(8) for _ in range(n))
        ref = lambda: zlib.crc32(data)  # noqa: E731
        if variant == "whole":
            return ref, ref
        chunk = {"chunk64k": 1 << 16, "chunk4k": 1 << 12}[variant]

        def chunked() -> int:
            c = 0
            mv = memoryview(data)
            for i in range(0, n, chunk):
                c = zlib.crc32(mv[i:i + chunk], c)
            return c
        return chunked, ref
    if op == "hash":
        data = rng.randbytes(n) if hasattr(rng, "randbytes") else bytes(rng.getrandbits(8) for _ in range(n))
        algo = {"md5": hashlib.md5, "sha1": hashlib.sha1, "sha256": hashlib.sha256}[variant]
        return (lambda: algo(data).digest()), (lambda: hashlib.new(variant, data).digest())
    if op == "sum":
        xs = [rng.random() for _ in range(n)]
        ref = lambda: math.fsum(xs)  # noqa: E731
        if variant == "builtin":
            return (lambda: sum(xs)), ref
        if variant == "fsum":
            return ref, ref

        def loop() -> float:
            s = 0.0
            for v in xs:
                s += v
            return s
        return loop, ref
    raise SystemExit(f"eval_cpu: unknown operator {op!r}")


def main() -> int:
    spec = json.loads(sys.argv[1])
    fn, ref = build(spec)
    got, want = fn(), ref()
    ok = abs(got - want) <= 1e-9 * max(1.0, abs(want)) if isinstance(want, float) else got == want
    if not ok:
        print(f"eval_cpu: {spec['id']}: wrong result {got!r} != {want!r}", file=sys.stderr)
        return 3
    ms = kforge.do_bench(fn, warmup=5, rep=25, return_mode="median", name=spec["id"])
    print("RESULT " + json.dumps({"id": spec["id"], "median_ms": ms}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
