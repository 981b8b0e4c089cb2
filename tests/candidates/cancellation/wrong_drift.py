"""Wrong by more than rounding: the result drifts by 0.5 % of x (an error of about 1e-2 where
the fp32 reference's own is about 5e-4). It misses the 1e-4 tolerance and the fp64 rule (at
most 10 times the reference's error against fp64)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def cancel_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    x = tl.load(x_ptr + i, mask=mask, other=0.0)
    y = (x * 1e4 + 1.0) - x * 1e4 + 5e-3 * x
    tl.store(out_ptr + i, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        cancel_kernel[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024)
        return out
