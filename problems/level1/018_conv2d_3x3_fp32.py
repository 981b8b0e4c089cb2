"""Standard 2-D convolution in fp32: NCHW input (32, 64, 56, 56), 128 output channels,
3 x 3 kernel, stride 1, padding 1, with bias, giving (32, 128, 56, 56). About 14.8 GFLOP;
an implicit-GEMM kernel sees M = 100352, N = 128, K = 576."""

import torch
import torch.nn as nn

BATCH = 32
IN_CHANNELS = 64
OUT_CHANNELS = 128
HEIGHT = 56
WIDTH = 56
KERNEL = 3
# large: (64, 128, 112, 112) -> 256 ch, ~9.5 ms (473 GFLOP fp32) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 64, "IN_CHANNELS": 128, "OUT_CHANNELS": 256, "HEIGHT": 112, "WIDTH": 112}


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel, stride=1, padding=kernel // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL]
