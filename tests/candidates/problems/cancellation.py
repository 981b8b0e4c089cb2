"""(1e4 x + y) - 1e4 x in fp32: y in exact arithmetic, but the fp32 reference loses up to half an
ulp of 1e4 x (about 5e-4) to cancellation. The output follows y, so a stale buffer is not it. A candidate that computes it more accurately differs
from the reference beyond fp32's 1e-4 tolerance; verify judges such a miss by the fp64 rule (its
error against the fp64 reference at most 10 times the fp32 reference's own), as a compiled
reduction that reorders a sum is judged."""
import torch
import torch.nn as nn

ROWS = 64
COLS = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return (x * 1e4 + y) - x * 1e4


def get_inputs():
    return [torch.randn(ROWS, COLS), torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
