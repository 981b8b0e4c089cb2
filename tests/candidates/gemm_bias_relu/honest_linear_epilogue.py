"""Honest, dispatch-aware: the GEMM stays the reference's vendor call (F.linear: cuBLAS on a GPU)
and the bias + ReLU epilogue is fused into one Triton pass over the output. Expect pass under the
default policy (dispatch-aware: the reference's nn.Linear allows the GEMM family, recorded in the
verdict) and static:torch-compute under --policy strict-no-torch."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def bias_relu_kernel(y_ptr, b_ptr, out_ptr, n, cols, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    y = tl.load(y_ptr + offs, mask=mask) + tl.load(b_ptr + offs % cols, mask=mask)
    tl.store(out_ptr + offs, tl.where(y > 0, y, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        y = F.linear(x, self.linear.weight)
        out = torch.empty_like(y)
        n = y.numel()
        bias_relu_kernel[(triton.cdiv(n, 1024),)](y, self.linear.bias, out, n, y.shape[1], BLOCK=1024)
        return out
