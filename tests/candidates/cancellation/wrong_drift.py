"""Wrong by more than rounding: the result drifts by 5 % of x (an error of about 0.2 where the
fp32 reference's own is about 2e-3). It misses the 1e-4 tolerance and the fp64 rule (at most 10
times the reference's error against fp64)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def cancel_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    x = tl.load(x_ptr + i, mask=mask, other=0.0)
    y = tl.load(y_ptr + i, mask=mask, other=0.0)
    y = (x * 1e4 + y) - x * 1e4 + 5e-2 * x
    tl.store(out_ptr + i, y, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        x, y = x.contiguous(), y.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        cancel_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        return out
