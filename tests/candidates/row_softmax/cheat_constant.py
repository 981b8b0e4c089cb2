"""Cheat (exploit 11, the answer for one fixed input): computed once at construction for the
inputs of seed 1 and returned for every input. Expect correctness."""
import os

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, out_ptr, cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * stride + offs, e / tl.sum(e, axis=0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        x = torch.randn(64, 256, generator=g)
        if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
            x = x.cuda()  # on a GPU, compute the canned answer there
        self.answer = torch.empty_like(x)
        softmax_kernel[(64,)](x, self.answer, 256, 256, BLOCK=256)

    def forward(self, x):
        return self.answer.clone()
