"""Reduction + normalize in fp32: each row of x (ROWS, COLS) = (16384, 4096) is centred by its
mean, divided by its (population) standard deviation plus eps, then scaled to unit L2
norm. Three row reductions (mean, variance, norm) followed by two elementwise passes."""

import torch
import torch.nn as nn

ROWS = 16384
COLS = 4096
# large: (262144, 4096), ~1.8 ms (4 GiB in + out) est. on an H200 (roofline, not measured)
LARGE = {"ROWS": 262144}


class Model(nn.Module):
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        centred = x - mean
        std = torch.sqrt(centred.pow(2).mean(dim=-1, keepdim=True))
        z = centred / (std + self.eps)
        return z / (z.norm(dim=-1, keepdim=True) + self.eps)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [1e-5]
