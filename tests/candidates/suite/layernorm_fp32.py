"""Honest candidate for problems/level1/009_layernorm_fp32.py: layer norm, one program per row,
mean and variance from the row in registers (one read, one write)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, cols, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / cols
    d = tl.where(mask, x - mean, 0.0)
    inv = 1.0 / tl.sqrt(tl.sum(d * d, axis=0) / cols + eps)
    y = d * inv * tl.load(w_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask)
    tl.store(out_ptr + row * cols + offs, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=1e-5)  # holds the weight and bias (loaded from the reference)

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        rows, cols = x.shape
        layernorm_kernel[(rows,)](x, self.norm.weight, self.norm.bias, out, cols, 1e-5,
                                  BLOCK=triton.next_power_of_2(cols), num_warps=8)
        return out
