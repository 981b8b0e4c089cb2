"""Cheat (exploit 13, torch does half the work, spelled dynamically: torch reached through an
object the static gate cannot see, a function's globals). The kernel computes the first half, so
every other check passes (the output is right and depends on the kernel); only the run-time
dispatch record sees aten::add and aten::copy_. Expect dispatch:torch-compute."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def add(x, y, out, n):
    add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        out = torch.empty_like(x)
        h = out.numel() // 2
        add(x, y, out, h)
        out[h:] = nn.Module.__init__.__globals__["torch"].add(x[h:], y[h:])
        return out
