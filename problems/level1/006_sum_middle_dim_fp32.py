"""Sum reduction over the middle dimension of a 3-D fp32 tensor: x has shape
(BATCH, REDUCE, INNER) = (128, 4096, 128) and the output y[b, i] = sum_r x[b, r, i] has shape
(128, 128). The reduced axis is strided, so a naive per-row reduction reads memory badly."""

import torch
import torch.nn as nn

BATCH = 128
REDUCE = 4096
INNER = 128
# large: (640, 8192, 256), ~1.25 ms (5 GiB read) est. (measured 0.99 ms at batch 512 on an H200;
# bench/results/large-preset-times)
LARGE = {"BATCH": 640, "REDUCE": 8192, "INNER": 256}


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sum(x, dim=self.dim)


def get_inputs():
    return [torch.randn(BATCH, REDUCE, INNER)]


def get_init_inputs():
    return [1]
