"""Honest, and a torch-internal thread appears while it runs: its first forward call arms torch's
own compile-worker timer (torch._inductor.compile_worker.timer.Timer), which starts the
``subproc_worker_timer`` thread Inductor's compile pool runs — the thread that once rejected an
honest Triton swish by performance:thread-count-timed. Started by torch's code, it is not the
candidate's: expect pass (the thread is in exploits:thread-count's evidence as torch's)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch._inductor.compile_worker.timer import Timer


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def nothing():
    return None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.timer = Timer(3600.0, nothing)

    def forward(self, x, y):
        self.timer.record_call()
        out = torch.empty_like(x)
        n = out.numel()
        add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
        return out
