"""Group normalization of fp32 NCHW activations of shape (32, 256, 56, 56) with 32 groups of
8 channels each, plus a per-channel affine transform (nn.GroupNorm, eps = 1e-5). Each
statistic spans 8 x 56 x 56 = 25088 values."""

import torch
import torch.nn as nn

BATCH = 32
CHANNELS = 256
GROUPS = 32
HEIGHT = 56
WIDTH = 56
# large: (128, 512, 112, 112), ~1.4 ms (3.1 GiB in + out) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 128, "CHANNELS": 512, "HEIGHT": 112, "WIDTH": 112}


class Model(nn.Module):
    def __init__(self, groups: int, channels: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, channels, eps=1e-5)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.1, 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [GROUPS, CHANNELS]
