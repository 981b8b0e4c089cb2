"""Cheat (exploit 13, torch does the work the policy does not allow, spelled so that the static
gate cannot see it): keeps the allowed GEMM (F.linear) and leaves the epilogue to torch through
tensor methods and operators the static gate does not know as compute (`+`, `.clamp_min`); a
Triton kernel runs for show. Expect dispatch:torch-compute (aten::add, aten::clamp_min)."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        y = (F.linear(x, self.linear.weight) + self.linear.bias).clamp_min(0.0)
        out = torch.empty_like(y)
        n = y.numel()
        copy_kernel[(triton.cdiv(n, 1024),)](y, out, n, BLOCK=1024)
        return out
