"""Leaky ReLU with negative slope 0.01 applied elementwise to an fp32 4-D tensor of shape
(64, 64, 128, 128), i.e. 64 Mi elements: y = x if x > 0 else 0.01 * x."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 64
CHANNELS = 64
HEIGHT = 128
WIDTH = 128
# large: (128, 128, 256, 256), ~1.8 ms (4 GiB in + out) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 128, "CHANNELS": 128, "HEIGHT": 256, "WIDTH": 256}


class Model(nn.Module):
    def __init__(self, negative_slope: float):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(x, negative_slope=self.negative_slope)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [0.01]
