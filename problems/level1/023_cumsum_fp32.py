"""Inclusive prefix sum (scan) along the last dimension of an fp32 matrix of shape
(ROWS, COLS) = (4096, 8192): y[r, c] = sum_{j <= c} x[r, j]. A parallel scan needs a
cross-block carry within each row."""

import torch
import torch.nn as nn

ROWS = 4096
COLS = 8192
# large: (65536, 16384), ~1.8 ms (4 GiB in + out) est. on an H200 (roofline, not measured)
LARGE = {"ROWS": 65536, "COLS": 16384}


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=self.dim)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [1]
