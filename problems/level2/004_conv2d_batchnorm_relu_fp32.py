"""Conv2d + BatchNorm (eval) + ReLU in fp32, the basic CNN unit: 3 x 3 convolution without bias
from 64 to 128 channels on (32, 64, 56, 56), padding 1, then per-channel batch norm with fixed
running statistics, then ReLU. The norm folds into the convolution's weights and bias."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32
IN_CHANNELS = 64
OUT_CHANNELS = 128
HEIGHT = 56
WIDTH = 56
# large: (64, 128, 112, 112) -> 256 ch, ~9.5 ms (473 GFLOP fp32) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 64, "IN_CHANNELS": 128, "OUT_CHANNELS": 256, "HEIGHT": 112, "WIDTH": 112}


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.bn_weight = nn.Parameter(torch.rand(out_channels) + 0.5)
        self.bn_bias = nn.Parameter(0.1 * torch.randn(out_channels))
        self.register_buffer("running_mean", 0.1 * torch.randn(out_channels))
        self.register_buffer("running_var", torch.rand(out_channels) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y = F.batch_norm(y, self.running_mean, self.running_var, self.bn_weight, self.bn_bias,
                         training=False, eps=1e-5)
        return torch.relu(y)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS]
