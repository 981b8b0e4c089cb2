"""GPU candidates for the kforge runtime evaluation: Triton kernels of six operators.

Usage:
    python3 eval_gpu.py SPEC_JSON     benchmark one candidate (needs torch, Triton and a GPU)
    python3 eval_gpu.py --list        print {"candidates": [...], "sizes": [...]} as JSON
                                      (plain Python 3.8+, no torch/Triton/kforge needed)

SPEC_JSON is one JSON object (one argv string):

    id        str   measurement name, e.g. "c0042" (also the kforge region name)
    operator  str   elementwise | reduction | softmax | layernorm | matmul | attention
    size      dict  problem size (ints), per operator:
                      elementwise {"n"}             out = gelu_tanh(x) * y + x over n elements
                      reduction   {"m", "n"}        row sums of an [m, n] matrix (fp32 output)
                      softmax     {"m", "n"}        row softmax of an [m, n] matrix
                      layernorm   {"m", "n"}        layernorm over the last dim, with weight and bias
                      matmul      {"m", "n", "k"}   C[m, n] = A[m, k] @ B[k, n], fp32 accumulation
                      attention   {"bh", "s", "d"}  softmax(Q K^T / sqrt(d)) V, Q/K/V [bh, s, d], d in {64, 128}
    params    dict  tile configuration (ints; every block size a power of two), per operator:
                      elementwise BLOCK
                      reduction   BLOCK_N, ROWS_PER_PROGRAM (default 1)
                      softmax     BLOCK_N (single pass when BLOCK_N >= n, else an online two-pass loop)
                      layernorm   BLOCK_N (single pass when BLOCK_N >= n, else a chunked three-pass loop)
                      matmul      BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M (default 8)
                      attention   BLOCK_M, BLOCK_N
                    plus the launch options num_warps (default 4) and num_stages (optional).
    dtype     str   float16 | bfloat16 | float32 (element type of inputs and outputs)
    seed      int   seed of the random inputs

Untimed: random inputs (normal, never zeros) on the GPU, JIT compilation, one run and a check
against a float64 torch reference (on a sample of rows/elements for large problems). Timed:
``kforge.do_bench`` (median of the samples, reported to the kforge daemon). Prints one line
``RESULT {"id": ..., "median_ms": ...}``.

Exit status: 0 ok; 2 bad usage or spec; 3 wrong result; 4 the kernel failed to compile or launch
(e.g. Triton's OutOfResources for a tile config too big for the GPU); 5 no torch/Triton/CUDA.
"""
from __future__ import annotations

import json
import math
import sys
from typing import Any, Callable, Dict, List, Optional, Tuple

# torch / triton / triton.language are imported lazily by _import_gpu() so that `--list` runs
# without them. The kernels below are plain functions, turned into Triton JIT functions by
# _jit() once `tl` is bound; Triton resolves `tl` through this module's globals at compile time.
torch: Any = None
triton: Any = None
tl: Any = None

OPERATORS = ("elementwise", "reduction", "softmax", "layernorm", "matmul", "attention")
DTYPES = ("float16", "bfloat16", "float32")
EXIT_OK, EXIT_USAGE, EXIT_WRONG, EXIT_KERNEL, EXIT_ENV = 0, 2, 3, 4, 5

#: Size keys of each operator.
SIZE_KEYS: Dict[str, Tuple[str, ...]] = {
    "elementwise": ("n",),
    "reduction": ("m", "n"),
    "softmax": ("m", "n"),
    "layernorm": ("m", "n"),
    "matmul": ("m", "n", "k"),
    "attention": ("bh", "s", "d"),
}
#: Tile (constexpr) parameters of each operator: name -> default (None: required).
TILE_PARAMS: Dict[str, Dict[str, Optional[int]]] = {
    "elementwise": {"BLOCK": None},
    "reduction": {"BLOCK_N": None, "ROWS_PER_PROGRAM": 1},
    "softmax": {"BLOCK_N": None},
    "layernorm": {"BLOCK_N": None},
    "matmul": {"BLOCK_M": None, "BLOCK_N": None, "BLOCK_K": None, "GROUP_M": 8},
    "attention": {"BLOCK_M": None, "BLOCK_N": None},
}
#: Tile parameters that are not block sizes (need not be powers of two).
NOT_POW2 = ("GROUP_M",)
#: Smallest block size per tile parameter (tl.dot needs tiles of at least 16).
MIN_BLOCK: Dict[str, Dict[str, int]] = {
    "matmul": {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16},
    "attention": {"BLOCK_M": 16, "BLOCK_N": 16},
}
LAUNCH_PARAMS = ("num_warps", "num_stages")
ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}

# ----------------------------------------------------------------------------------------------
# Candidate space and problem sizes (no GPU needed)
# ----------------------------------------------------------------------------------------------

#: H200 roofline used for the estimates.
DRAM_BYTES_PER_S = 4.0e12
TENSOR_FLOPS = 790e12  # fp16/bf16 dense tensor cores
FP32_FLOPS = 60e12  # fp32 without tensor cores
EST_FLOOR_MS = 0.005


def candidates() -> List[Dict[str, Any]]:
    """The candidate space: a handful of tile configs per operator, all valid on Hopper
    for float16/bfloat16 (float32 matmul/attention with the biggest tiles may exceed shared memory)."""
    out: List[Dict[str, Any]] = []

    def add(op: str, **params: int) -> None:
        out.append({"operator": op, "params": dict(params)})

    for block, warps in ((256, 2), (1024, 4), (2048, 4), (4096, 8), (8192, 8)):
        add("elementwise", BLOCK=block, num_warps=warps)
    for block_n, rows, warps in ((256, 8, 4), (512, 4, 4), (1024, 1, 4), (4096, 1, 8), (8192, 1, 16)):
        add("reduction", BLOCK_N=block_n, ROWS_PER_PROGRAM=rows, num_warps=warps)
    for block_n, warps in ((512, 2), (1024, 4), (2048, 4), (4096, 8), (8192, 16), (16384, 16)):
        add("softmax", BLOCK_N=block_n, num_warps=warps)
    for block_n, warps in ((512, 2), (1024, 4), (2048, 8), (4096, 8), (8192, 16)):
        add("layernorm", BLOCK_N=block_n, num_warps=warps)
    for bm, bn, bk, gm, warps, stages in (
        (128, 128, 64, 8, 8, 3),
        (128, 256, 64, 8, 8, 3),
        (64, 64, 32, 8, 4, 4),
        (64, 128, 64, 8, 4, 3),
        (128, 64, 64, 8, 4, 4),
        (128, 128, 32, 8, 4, 4),
    ):
        add("matmul", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=gm, num_warps=warps, num_stages=stages)
    for bm, bn, warps, stages in ((64, 64, 4, 3), (64, 128, 4, 2), (128, 32, 8, 4), (128, 64, 8, 3), (128, 128, 8, 2)):
        add("attention", BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
    return out


def estimate_ms(operator: str, size: Dict[str, int], dtype: str) -> float:
    """Roofline estimate on an H200: max(bytes / DRAM bandwidth, flops / peak), at least EST_FLOOR_MS."""
    e = ELEMENT_BYTES[dtype]
    tensor_peak = FP32_FLOPS if dtype == "float32" else TENSOR_FLOPS
    if operator == "elementwise":
        n = size["n"]
        nbytes, flops, peak = 3 * n * e, 20 * n, FP32_FLOPS
    elif operator == "reduction":
        m, n = size["m"], size["n"]
        nbytes, flops, peak = m * n * e + 4 * m, m * n, FP32_FLOPS
    elif operator == "softmax":
        m, n = size["m"], size["n"]
        nbytes, flops, peak = 2 * m * n * e, 5 * m * n, FP32_FLOPS
    elif operator == "layernorm":
        m, n = size["m"], size["n"]
        nbytes, flops, peak = 2 * m * n * e + 2 * n * e, 8 * m * n, FP32_FLOPS
    elif operator == "matmul":
        m, n, k = size["m"], size["n"], size["k"]
        nbytes, flops, peak = (m * k + k * n + m * n) * e, 2 * m * n * k, tensor_peak
    elif operator == "attention":
        bh, s, d = size["bh"], size["s"], size["d"]
        nbytes, flops, peak = 4 * bh * s * d * e, 4 * bh * s * s * d, tensor_peak
    else:
        raise ValueError(f"unknown operator {operator!r}")
    seconds = max(nbytes / DRAM_BYTES_PER_S, flops / peak)
    return max(EST_FLOOR_MS, float(f"{seconds * 1e3:.4g}"))


#: (operator, size, dtype). Roofline estimates aim inside the workload generator's targets
#: (<0.1: 0.02-0.08, 0.1-1: 0.15-0.8, 1-10: 1.5-8, >10: 12-45 ms) or a little below them, as
#: real kernels run slower than the roofline; odd sizes exercise the masked tails. Memory-bound
#: operators stop around 1-1.5 ms (4-5 GB of tensors); the >10 ms bucket is matmul/attention.
_SIZES: Tuple[Tuple[str, Dict[str, int], str], ...] = (
    # elementwise: 3 n e bytes
    ("elementwise", {"n": 1 << 23}, "bfloat16"),
    ("elementwise", {"n": 10_000_019}, "float32"),
    ("elementwise", {"n": 1 << 24}, "float32"),
    ("elementwise", {"n": 3 << 25}, "float16"),
    ("elementwise", {"n": 1 << 27}, "float32"),
    ("elementwise", {"n": 3 << 28}, "float16"),
    # reduction: m n e bytes
    ("reduction", {"m": 5000, "n": 3000}, "float32"),
    ("reduction", {"m": 8192, "n": 8192}, "float16"),
    ("reduction", {"m": 16384, "n": 16384}, "float32"),
    ("reduction", {"m": 32768, "n": 32768}, "bfloat16"),
    ("reduction", {"m": 65536, "n": 40960}, "float16"),
    # softmax: 2 m n e bytes
    ("softmax", {"m": 4096, "n": 1000}, "float32"),
    ("softmax", {"m": 8192, "n": 4096}, "float16"),
    ("softmax", {"m": 8192, "n": 32768}, "bfloat16"),
    ("softmax", {"m": 32768, "n": 8192}, "float32"),
    ("softmax", {"m": 8192, "n": 163840}, "float16"),
    # layernorm: 2 m n e bytes
    ("layernorm", {"m": 8192, "n": 1280}, "float16"),
    ("layernorm", {"m": 16384, "n": 4096}, "bfloat16"),
    ("layernorm", {"m": 30000, "n": 5120}, "float32"),
    ("layernorm", {"m": 65536, "n": 8192}, "bfloat16"),
    ("layernorm", {"m": 20480, "n": 65536}, "float16"),
    # matmul: 2 m n k flops
    ("matmul", {"m": 2048, "n": 2048, "k": 2048}, "float16"),
    ("matmul", {"m": 3000, "n": 5000, "k": 1000}, "bfloat16"),
    ("matmul", {"m": 4096, "n": 4096, "k": 4096}, "bfloat16"),
    ("matmul", {"m": 6144, "n": 6144, "k": 6144}, "float16"),
    ("matmul", {"m": 8192, "n": 8192, "k": 8192}, "float16"),
    ("matmul", {"m": 12288, "n": 12288, "k": 12288}, "bfloat16"),
    ("matmul", {"m": 16384, "n": 16384, "k": 16384}, "bfloat16"),
    ("matmul", {"m": 16384, "n": 16384, "k": 32768}, "float16"),
    # attention: 4 bh s^2 d flops
    ("attention", {"bh": 16, "s": 1000, "d": 128}, "float16"),
    ("attention", {"bh": 32, "s": 2048, "d": 64}, "bfloat16"),
    ("attention", {"bh": 32, "s": 4096, "d": 128}, "bfloat16"),
    ("attention", {"bh": 64, "s": 8192, "d": 64}, "float16"),
    ("attention", {"bh": 64, "s": 8192, "d": 128}, "bfloat16"),
    ("attention", {"bh": 64, "s": 16384, "d": 128}, "bfloat16"),
    ("attention", {"bh": 48, "s": 32768, "d": 128}, "float16"),
)


def sizes() -> List[Dict[str, Any]]:
    """Problem sizes with their roofline estimates: [{operator, size, dtype, est_ms}]."""
    return [
        {"operator": op, "size": dict(size), "dtype": dtype, "est_ms": estimate_ms(op, size, dtype)}
        for op, size, dtype in _SIZES
    ]


# ----------------------------------------------------------------------------------------------
# Spec parsing (no GPU needed)
# ----------------------------------------------------------------------------------------------


class SpecError(ValueError):
    """The spec is malformed (exit 2)."""


def _is_pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


def _as_int(where: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise SpecError(f"{where} must be an integer, got {v!r}")
    return v


def parse_spec(text: str) -> Dict[str, Any]:
    """Parse and validate SPEC_JSON; fills default params. Raises SpecError."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(f"SPEC_JSON is not JSON: {e}") from e
    if not isinstance(spec, dict):
        raise SpecError("SPEC_JSON must be a JSON object")
    for key in ("id", "operator", "size", "params", "dtype", "seed"):
        if key not in spec:
            raise SpecError(f"spec lacks {key!r}")
    op = spec["operator"]
    if op not in OPERATORS:
        raise SpecError(f"operator must be one of {OPERATORS}, got {op!r}")
    if spec["dtype"] not in DTYPES:
        raise SpecError(f"dtype must be one of {DTYPES}, got {spec['dtype']!r}")
    spec["id"] = str(spec["id"])
    spec["seed"] = _as_int("seed", spec["seed"])
    if not isinstance(spec["size"], dict) or not isinstance(spec["params"], dict):
        raise SpecError("size and params must be JSON objects")

    size: Dict[str, int] = {}
    for key in SIZE_KEYS[op]:
        if key not in spec["size"]:
            raise SpecError(f"{op} size needs {list(SIZE_KEYS[op])}, got {spec['size']!r}")
        size[key] = _as_int(f"size.{key}", spec["size"][key])
        if size[key] < 1:
            raise SpecError(f"size.{key} must be >= 1, got {size[key]}")
    if op == "attention" and not (_is_pow2(size["d"]) and 16 <= size["d"] <= 256):
        raise SpecError(f"attention head dim d must be a power of two in [16, 256] (64 or 128), got {size['d']}")

    given = dict(spec["params"])
    params: Dict[str, int] = {}
    for name, default in TILE_PARAMS[op].items():
        if name in given:
            params[name] = _as_int(f"params.{name}", given.pop(name))
        elif default is not None:
            params[name] = default
        else:
            raise SpecError(f"{op} params need {name} (got {spec['params']!r})")
        v = params[name]
        if name in NOT_POW2:
            if v < 1:
                raise SpecError(f"params.{name} must be >= 1, got {v}")
        elif not _is_pow2(v):
            raise SpecError(f"params.{name} must be a power of two, got {v}")
        low = MIN_BLOCK.get(op, {}).get(name, 1)
        if v < low:
            raise SpecError(f"params.{name} must be >= {low}, got {v}")
    params["num_warps"] = _as_int("params.num_warps", given.pop("num_warps", 4))
    if not (_is_pow2(params["num_warps"]) and params["num_warps"] <= 32):
        raise SpecError(f"params.num_warps must be a power of two <= 32, got {params['num_warps']}")
    if "num_stages" in given:
        params["num_stages"] = _as_int("params.num_stages", given.pop("num_stages"))
        if params["num_stages"] < 1:
            raise SpecError(f"params.num_stages must be >= 1, got {params['num_stages']}")
    if given:
        raise SpecError(f"unknown {op} params {sorted(given)}")
    spec["size"], spec["params"] = size, params
    return spec


# ----------------------------------------------------------------------------------------------
# Triton kernels (plain functions; see _jit). All tile sizes are tl.constexpr; masks handle tails.
# ----------------------------------------------------------------------------------------------


def _elementwise_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    t = 1.0 - 2.0 / (1.0 + tl.exp(2.0 * u))  # tanh(u); saturates to +-1 without NaN
    out = 0.5 * x * (1.0 + t) * y + x
    tl.store(out_ptr + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def _reduction_kernel(x_ptr, out_ptr, n_rows, n_cols, stride_row,
                      BLOCK_N: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * ROWS_PER_PROGRAM + tl.arange(0, ROWS_PER_PROGRAM)
    row_mask = rows < n_rows
    row_ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_row
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([ROWS_PER_PROGRAM, BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        offs = start + cols
        mask = row_mask[:, None] & (offs[None, :] < n_cols)
        acc += tl.load(row_ptrs + offs[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows, tl.sum(acc, axis=1), mask=row_mask)


def _softmax_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_out,
                    BLOCK_N: tl.constexpr, SINGLE_PASS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    cols = tl.arange(0, BLOCK_N)
    if SINGLE_PASS:  # BLOCK_N >= n_cols: the row stays in registers
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
        num = tl.exp(x - tl.max(x, axis=0))
        den = tl.sum(num, axis=0)
        tl.store(out_row + cols, (num / den).to(out_ptr.dtype.element_ty), mask=mask)
    else:  # BLOCK_N < n_cols: online (max, sum) per lane, then normalize in a second pass
        m_vec = tl.full([BLOCK_N], float("-inf"), dtype=tl.float32)
        s_vec = tl.zeros([BLOCK_N], dtype=tl.float32)
        # The first chunk is full (BLOCK_N < n_cols), so every lane's max is finite after it
        # and exp(m_vec - m_new) never sees (-inf) - (-inf).
        for start in range(0, n_cols, BLOCK_N):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < n_cols, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m_vec, x)
            s_vec = s_vec * tl.exp(m_vec - m_new) + tl.exp(x - m_new)
            m_vec = m_new
        row_max = tl.max(m_vec, axis=0)
        row_sum = tl.sum(s_vec * tl.exp(m_vec - row_max), axis=0)
        inv_sum = 1.0 / row_sum
        for start in range(0, n_cols, BLOCK_N):
            offs = start + cols
            mask = offs < n_cols
            x = tl.load(x_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
            y = tl.exp(x - row_max) * inv_sum
            tl.store(out_row + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _layernorm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, stride_x, stride_out, eps,
                      BLOCK_N: tl.constexpr, SINGLE_PASS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    out_row = out_ptr + row * stride_out
    cols = tl.arange(0, BLOCK_N)
    if SINGLE_PASS:  # BLOCK_N >= n_cols
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / n_cols
        diff = tl.where(mask, x - mean, 0.0)
        var = tl.sum(diff * diff, axis=0) / n_cols
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = diff * rstd * w + b
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
    else:  # chunked: mean, then variance around it, then normalize
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            offs = start + cols
            acc += tl.load(x_row + offs, mask=offs < n_cols, other=0.0).to(tl.float32)
        mean = tl.sum(acc, axis=0) / n_cols
        acc2 = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            offs = start + cols
            mask = offs < n_cols
            x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
            diff = tl.where(mask, x - mean, 0.0)
            acc2 += diff * diff
        var = tl.sum(acc2, axis=0) / n_cols
        rstd = 1.0 / tl.sqrt(var + eps)
        for start in range(0, n_cols, BLOCK_N):
            offs = start + cols
            mask = offs < n_cols
            x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            y = (x - mean) * rstd * w + b
            tl.store(out_row + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                   stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    # Grouped ordering of the output tiles for L2 reuse (as in Triton's matmul tutorial).
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Rows/columns past the edge wrap around (loads stay in bounds, unmasked in M and N);
    # the store below is masked.
    offs_am = offs_m % M
    offs_bn = offs_n % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_am.to(tl.int64)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_bn.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kk in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - kk * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :] * stride_cn
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


def _attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, seq_len, qk_scale, stride_bh, stride_s,
                      HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      INPUT_PRECISION: tl.constexpr):
    # One program: BLOCK_M queries of one (batch, head); FlashAttention-style online softmax
    # over key blocks. qk_scale = log2(e) / sqrt(HEAD_DIM), so exp2 gives the softmax.
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    base = bh * stride_bh
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    m_mask = offs_m < seq_len
    q = tl.load(q_ptr + base + offs_m[:, None] * stride_s + offs_d[None, :], mask=m_mask[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(0, seq_len, BLOCK_N):
        cols = start_n + offs_n
        n_mask = cols < seq_len
        kv_offs = base + cols[:, None] * stride_s + offs_d[None, :]
        k = tl.load(k_ptr + kv_offs, mask=n_mask[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale
        qk = tl.where(n_mask[None, :], qk, float("-inf"))
        # Every key block has at least one valid column, so m_new is finite.
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        p = tl.math.exp2(qk - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]
        v = tl.load(v_ptr + kv_offs, mask=n_mask[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=INPUT_PRECISION)
        m_i = m_new
    acc = acc / l_i[:, None]
    tl.store(o_ptr + base + offs_m[:, None] * stride_s + offs_d[None, :], acc.to(o_ptr.dtype.element_ty),
             mask=m_mask[:, None])


# ----------------------------------------------------------------------------------------------
# GPU side: inputs, launch and reference check per operator
# ----------------------------------------------------------------------------------------------

Launch = Callable[[], Any]
Check = Callable[[], None]

_JITTED: Dict[str, Any] = {}
#: Relative tolerance per output dtype (about 4 half-ulps for fp16/bf16); atol = rtol * max|ref|.
_RTOL = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-4}
#: Above this many elements a reference is computed on a sample only (fp64 copies stay small).
_CHECK_BUDGET = 1 << 24


def _import_gpu() -> None:
    global torch, triton, tl
    if torch is not None:
        return
    import torch as _torch
    import triton as _triton
    import triton.language as _tl

    torch, triton, tl = _torch, _triton, _tl


def _jit(fn: Callable[..., Any]) -> Any:
    """The Triton JIT function of a kernel above (made once; `tl` must be bound)."""
    name = fn.__name__
    if name not in _JITTED:
        _JITTED[name] = triton.jit(fn)
    return _JITTED[name]


def _device() -> str:
    """The CUDA device kforge.do_bench will time on (``$KFORGE_DEVICE`` aware), else "cuda"."""
    try:
        from kforge.bench import resolve_device

        dev = str(resolve_device())
    except Exception:  # kforge missing or a bad $KFORGE_DEVICE: plain "cuda"
        dev = "cuda"
    return dev if dev.startswith("cuda") else "cuda"


def _launch_opts(params: Dict[str, int]) -> Dict[str, int]:
    return {k: params[k] for k in LAUNCH_PARAMS if k in params}


def _sample(n: int, keep: int, gen: Any, dev: str) -> Any:
    """Indices into range(n): all of them if n <= keep, else ~keep random ones plus both ends."""
    if n <= keep:
        return torch.arange(n, device=dev)
    picked = torch.randint(0, n, (keep,), device=dev, generator=gen)
    ends = torch.tensor([0, n - 1], device=dev)
    return torch.unique(torch.cat([picked, ends]))  # sorted


def _assert_close(got: Any, ref: Any, dtype: str) -> None:
    rtol = _RTOL[dtype]
    scale = float(ref.abs().max()) if ref.numel() else 1.0
    atol = rtol * max(scale, 1e-6)
    torch.testing.assert_close(got.to(torch.float64), ref.to(torch.float64), rtol=rtol, atol=atol)


def _build_elementwise(spec: Dict[str, Any], dev: str, gen: Any) -> Tuple[Launch, Check]:
    n, p, dt = spec["size"]["n"], spec["params"], getattr(torch, spec["dtype"])
    x = torch.randn(n, device=dev, dtype=dt, generator=gen)
    y = torch.randn(n, device=dev, dtype=dt, generator=gen)
    out = torch.empty_like(x)
    kernel, grid, opts = _jit(_elementwise_kernel), (triton.cdiv(n, p["BLOCK"]),), _launch_opts(p)

    def launch() -> Any:
        return kernel[grid](x, y, out, n, BLOCK=p["BLOCK"], **opts)

    def check() -> None:
        if n <= _CHECK_BUDGET:
            idx = torch.arange(n, device=dev)
        else:  # a random sample plus the tail block
            tail = torch.arange(max(0, n - 3 * p["BLOCK"]), n, device=dev)
            idx = torch.cat([_sample(n, 1 << 20, gen, dev), tail])
        xs, ys = x[idx].to(torch.float64), y[idx].to(torch.float64)
        ref = torch.nn.functional.gelu(xs, approximate="tanh") * ys + xs
        _assert_close(out[idx], ref, spec["dtype"])

    return launch, check


def _build_reduction(spec: Dict[str, Any], dev: str, gen: Any) -> Tuple[Launch, Check]:
    m, n = spec["size"]["m"], spec["size"]["n"]
    p, dt = spec["params"], getattr(torch, spec["dtype"])
    x = torch.randn(m, n, device=dev, dtype=dt, generator=gen)
    out = torch.empty(m, device=dev, dtype=torch.float32)
    rows_pp = p["ROWS_PER_PROGRAM"]
    kernel, grid, opts = _jit(_reduction_kernel), (triton.cdiv(m, rows_pp),), _launch_opts(p)

    def launch() -> Any:
        return kernel[grid](x, out, m, n, x.stride(0), BLOCK_N=p["BLOCK_N"], ROWS_PER_PROGRAM=rows_pp, **opts)

    def check() -> None:
        rows = _sample(m, max(2, _CHECK_BUDGET // n), gen, dev)
        ref = x.index_select(0, rows).to(torch.float64).sum(dim=1)
        _assert_close(out.index_select(0, rows), ref, "float32")  # fp32 output

    return launch, check


def _build_softmax(spec: Dict[str, Any], dev: str, gen: Any) -> Tuple[Launch, Check]:
    m, n = spec["size"]["m"], spec["size"]["n"]
    p, dt = spec["params"], getattr(torch, spec["dtype"])
    x = torch.randn(m, n, device=dev, dtype=dt, generator=gen)
    out = torch.empty_like(x)
    single = p["BLOCK_N"] >= n
    kernel, grid, opts = _jit(_softmax_kernel), (m,), _launch_opts(p)

    def launch() -> Any:
        return kernel[grid](x, out, n, x.stride(0), out.stride(0), BLOCK_N=p["BLOCK_N"], SINGLE_PASS=single, **opts)

    def check() -> None:
        rows = _sample(m, max(2, _CHECK_BUDGET // n), gen, dev)
        ref = torch.softmax(x.index_select(0, rows).to(torch.float64), dim=1)
        _assert_close(out.index_select(0, rows), ref, spec["dtype"])

    return launch, check


def _build_layernorm(spec: Dict[str, Any], dev: str, gen: Any) -> Tuple[Launch, Check]:
    m, n = spec["size"]["m"], spec["size"]["n"]
    p, dt = spec["params"], getattr(torch, spec["dtype"])
    eps = 1e-5
    x = torch.randn(m, n, device=dev, dtype=dt, generator=gen)
    w = (1.0 + 0.1 * torch.randn(n, device=dev, dtype=torch.float32, generator=gen)).to(dt)
    b = (0.1 * torch.randn(n, device=dev, dtype=torch.float32, generator=gen)).to(dt)
    out = torch.empty_like(x)
    single = p["BLOCK_N"] >= n
    kernel, grid, opts = _jit(_layernorm_kernel), (m,), _launch_opts(p)

    def launch() -> Any:
        return kernel[grid](x, w, b, out, n, x.stride(0), out.stride(0), eps,
                            BLOCK_N=p["BLOCK_N"], SINGLE_PASS=single, **opts)

    def check() -> None:
        rows = _sample(m, max(2, _CHECK_BUDGET // n), gen, dev)
        f64 = torch.float64
        ref = torch.nn.functional.layer_norm(x.index_select(0, rows).to(f64), (n,), w.to(f64), b.to(f64), eps)
        _assert_close(out.index_select(0, rows), ref, spec["dtype"])

    return launch, check


def _build_matmul(spec: Dict[str, Any], dev: str, gen: Any) -> Tuple[Launch, Check]:
    m, n, k = spec["size"]["m"], spec["size"]["n"], spec["size"]["k"]
    p, dt = spec["params"], getattr(torch, spec["dtype"])
    a = torch.randn(m, k, device=dev, dtype=dt, generator=gen)
    b = torch.randn(k, n, device=dev, dtype=dt, generator=gen)
    b.mul_(1.0 / math.sqrt(k))  # outputs ~ N(0, 1)
    c = torch.empty(m, n, device=dev, dtype=dt)
    precision = "ieee" if spec["dtype"] == "float32" else "tf32"  # fp32: true fp32 products, not TF32
    grid = (triton.cdiv(m, p["BLOCK_M"]) * triton.cdiv(n, p["BLOCK_N"]),)
    kernel, opts = _jit(_matmul_kernel), _launch_opts(p)

    def launch() -> Any:
        return kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                            c.stride(0), c.stride(1), BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"],
                            BLOCK_K=p["BLOCK_K"], GROUP_M=p["GROUP_M"], INPUT_PRECISION=precision, **opts)

    def check() -> None:
        rows, cols = _sample(m, 1024, gen, dev), _sample(n, 1024, gen, dev)
        ref = a.index_select(0, rows).to(torch.float64) @ b.index_select(1, cols).to(torch.float64)
        _assert_close(c.index_select(0, rows).index_select(1, cols), ref, spec["dtype"])

    return launch, check


def _build_attention(spec: Dict[str, Any], dev: str, gen: Any) -> Tuple[Launch, Check]:
    bh, s, d = spec["size"]["bh"], spec["size"]["s"], spec["size"]["d"]
    p, dt = spec["params"], getattr(torch, spec["dtype"])
    q = torch.randn(bh, s, d, device=dev, dtype=dt, generator=gen)
    k = torch.randn(bh, s, d, device=dev, dtype=dt, generator=gen)
    v = torch.randn(bh, s, d, device=dev, dtype=dt, generator=gen)
    o = torch.empty_like(q)
    sm_scale = 1.0 / math.sqrt(d)
    qk_scale = sm_scale * 1.4426950408889634  # log2(e)
    precision = "ieee" if spec["dtype"] == "float32" else "tf32"
    grid = (triton.cdiv(s, p["BLOCK_M"]), bh)
    kernel, opts = _jit(_attention_kernel), _launch_opts(p)

    def launch() -> Any:
        return kernel[grid](q, k, v, o, s, qk_scale, q.stride(0), q.stride(1), HEAD_DIM=d,
                            BLOCK_M=p["BLOCK_M"], BLOCK_N=p["BLOCK_N"], INPUT_PRECISION=precision, **opts)

    def check() -> None:
        heads = sorted({0, bh - 1, int(torch.randint(0, bh, (1,), generator=gen, device=dev))})
        rows = _sample(s, 512, gen, dev)
        got, ref = [], []
        f64 = torch.float64
        for h in heads:
            qh = q[h].index_select(0, rows).to(f64)
            scores = (qh @ k[h].to(f64).transpose(0, 1)) * sm_scale
            ref.append(torch.softmax(scores, dim=1) @ v[h].to(f64))
            got.append(o[h].index_select(0, rows))
        _assert_close(torch.cat(got), torch.cat(ref), spec["dtype"])

    return launch, check


BUILDERS: Dict[str, Callable[[Dict[str, Any], str, Any], Tuple[Launch, Check]]] = {
    "elementwise": _build_elementwise,
    "reduction": _build_reduction,
    "softmax": _build_softmax,
    "layernorm": _build_layernorm,
    "matmul": _build_matmul,
    "attention": _build_attention,
}


def _describe(spec: Dict[str, Any]) -> str:
    return f"{spec['id']} ({spec['operator']} {spec['dtype']} size={spec['size']} params={spec['params']})"


def run(spec: Dict[str, Any]) -> int:
    """Check and time one candidate; returns the exit status."""
    try:
        _import_gpu()
    except ImportError as e:
        print(f"eval_gpu: {spec['id']}: needs torch and Triton: {e}", file=sys.stderr)
        return EXIT_ENV
    if not torch.cuda.is_available():
        print(f"eval_gpu: {spec['id']}: torch sees no CUDA device", file=sys.stderr)
        return EXIT_ENV
    dev = _device()
    if torch.device(dev).index is not None:
        torch.cuda.set_device(dev)
    torch.manual_seed(spec["seed"])
    gen = torch.Generator(device=dev)
    gen.manual_seed(spec["seed"])

    # Untimed: inputs, compilation, one run, correctness.
    launch, check = BUILDERS[spec["operator"]](spec, dev, gen)
    try:
        launch()
        torch.cuda.synchronize()
    except Exception as e:  # CompilationError, OutOfResources, launch failures
        print(f"eval_gpu: {_describe(spec)}: kernel failed to compile or run: {type(e).__name__}: {e}",
              file=sys.stderr)
        return EXIT_KERNEL
    try:
        check()
    except AssertionError as e:
        print(f"eval_gpu: {_describe(spec)}: WRONG RESULT against the torch reference:\n{e}", file=sys.stderr)
        return EXIT_WRONG

    # Timed.
    import kforge

    ms = kforge.do_bench(lambda: launch(), warmup=25, rep=100, return_mode="median", name=spec["id"], device=dev)
    print("RESULT " + json.dumps({"id": spec["id"], "median_ms": ms}), flush=True)
    return EXIT_OK


def main(argv: List[str]) -> int:
    if len(argv) == 2 and argv[1] == "--list":
        print(json.dumps({"candidates": candidates(), "sizes": sizes()}))
        return EXIT_OK
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__, file=sys.stderr)
        return EXIT_USAGE
    try:
        spec = parse_spec(argv[1])
    except SpecError as e:
        print(f"eval_gpu: bad spec: {e}", file=sys.stderr)
        return EXIT_USAGE
    return run(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
