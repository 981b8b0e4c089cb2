"""Honest dispatch-aware candidate for problems/level2/002_gemm_bias_gelu_bf16.py: the reference's
GEMM stays a vendor call (F.linear with its bias: cuBLAS, the bias added in its epilogue before
the one rounding to bf16, as in the reference), the tanh GELU runs in one Triton pass over the
GEMM's output, computed in fp32."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def gelu_tanh_kernel(y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(y_ptr + offs, mask=mask).to(tl.float32)
    inner = 0.7978845608028654 * (v + 0.044715 * v * v * v)
    t = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
    tl.store(out_ptr + offs, (0.5 * v * (1.0 + t)).to(tl.bfloat16), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.linear = nn.Linear(hidden, ffn).to(torch.bfloat16)

    def forward(self, x):
        y = F.linear(x, self.linear.weight, self.linear.bias)
        out = torch.empty_like(y)
        n = y.numel()
        gelu_tanh_kernel[(triton.cdiv(n, 4096),)](y, out, n, BLOCK=4096, num_warps=8)
        return out
