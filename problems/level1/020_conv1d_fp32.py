"""1-D convolution in fp32 over sequences: input (32, 256, 2048) in NCL layout, 256 output
channels, kernel size 5, padding 2 (length-preserving), with bias. About 43 GFLOP, the shape
of a temporal convolution in an audio or sequence model."""

import torch
import torch.nn as nn

BATCH = 32
IN_CHANNELS = 256
OUT_CHANNELS = 256
LENGTH = 2048
KERNEL = 5
# large: (32, 512, 4096) -> 512 ch, ~7 ms (344 GFLOP fp32) est. on an H200 (roofline, not measured)
LARGE = {"IN_CHANNELS": 512, "OUT_CHANNELS": 512, "LENGTH": 4096}


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel: int):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel, padding=kernel // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, LENGTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL]
