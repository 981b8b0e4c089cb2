"""Smooth L1 (Huber-style) loss with beta = 1.0 between fp32 predictions and targets of shape
(16384, 4096), mean-reduced to a scalar: 0.5 * d^2 / beta where |d| < beta, else
|d| - 0.5 * beta. Two 256 MiB streams in, one float out."""

import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 16384
COLS = 4096
# large: 2 x (131072, 4096), ~0.9 ms (4 GiB read) est. on an H200 (roofline, not measured)
LARGE = {"ROWS": 131072}


class Model(nn.Module):
    def __init__(self, beta: float):
        super().__init__()
        self.beta = beta

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.smooth_l1_loss(pred, target, beta=self.beta, reduction="mean")


def get_inputs():
    return [torch.randn(ROWS, COLS), torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [1.0]
