"""GroupNorm + SiLU + 3 x 3 convolution in bf16, the pre-activation unit of a diffusion UNet
resblock: input (16, 128, 64, 64), 32 groups, then a convolution from 128 to 128 channels with
padding 1 and bias. The normalized activation can be produced while loading conv tiles."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16
CHANNELS = 128
GROUPS = 32
HEIGHT = 64
WIDTH = 64
# large: (64, 256, 128, 128), ~2 ms (1.2 TFLOP bf16) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 64, "CHANNELS": 256, "HEIGHT": 128, "WIDTH": 128}


class Model(nn.Module):
    def __init__(self, channels: int, groups: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels).to(torch.bfloat16)
        self.conv = nn.Conv2d(channels, channels, 3, padding=1).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.silu(self.norm(x)))


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH, dtype=torch.bfloat16)]


def get_init_inputs():
    return [CHANNELS, GROUPS]
