"""Cheat (exploit 7/8, result cached by pointer and version counter: repeated timed calls with the
same inputs would cost nothing). Expect exploits:input-perturbation (contents changed through
.data: same pointer, same version)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def add(x, y):
    out = torch.empty_like(x)
    n = out.numel()
    add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        key = (x.data_ptr(), x._version, y.data_ptr(), y._version)
        if getattr(self, "key", None) != key:
            self.key, self.last = key, add(x, y)
        return self.last
