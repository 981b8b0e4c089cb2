"""A wrong candidate: a Triton kernel that subtracts instead of adding (rejected by correctness)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sub_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) - tl.load(y_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        out = torch.empty_like(x)
        n = out.numel()
        sub_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        return out
