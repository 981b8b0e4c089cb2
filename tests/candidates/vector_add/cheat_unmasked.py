"""Cheat (a shortcut valid only for the sizes benchmarked: no bounds mask, N assumed a multiple
of the block). Expect correctness on the ragged size."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))


def add(x, y):
    out = torch.empty_like(x)
    n = out.numel()
    add_kernel[(n // 1024,)](x, y, out, n, BLOCK=1024)
    return out


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return add(x, y)
