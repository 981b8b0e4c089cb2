"""Exact (erf-based) GELU applied elementwise to an fp32 tensor of shape (16384, 4096),
i.e. 64 Mi elements: y = 0.5 * x * (1 + erf(x / sqrt(2))). Bandwidth-bound elementwise op."""

import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 16384
COLS = 4096
# large: (262144, 4096), ~1.8 ms (4 GiB in + out) est. on an H200 (roofline, not measured)
LARGE = {"ROWS": 262144}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="none")


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
