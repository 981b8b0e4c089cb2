"""Depthwise 3 x 3 convolution in bf16 (groups = channels, one filter per channel, stride 1,
padding 1, no bias) on NCHW input (32, 256, 112, 112). Only 9 multiply-adds per output, so
it is bandwidth-bound, unlike a dense convolution."""

import torch
import torch.nn as nn

BATCH = 32
CHANNELS = 256
HEIGHT = 112
WIDTH = 112
KERNEL = 3
# large: (128, 512, 112, 112), ~1 ms (1.6 GiB in + out, depthwise) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 128, "CHANNELS": 512}


class Model(nn.Module):
    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel, padding=kernel // 2, groups=channels,
                              bias=False).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH, dtype=torch.bfloat16)]


def get_init_inputs():
    return [CHANNELS, KERNEL]
