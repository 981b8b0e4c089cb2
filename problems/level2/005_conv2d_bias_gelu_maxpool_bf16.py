"""Conv2d + bias + GELU + 2 x 2 max pooling in bf16: 3 x 3 convolution (no built-in bias) from
64 to 128 channels on (16, 64, 112, 112), padding 1, then a separate per-channel bias, exact
GELU and a stride-2 max pool, giving (16, 128, 56, 56). The pool can run in the epilogue."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16
IN_CHANNELS = 64
OUT_CHANNELS = 128
HEIGHT = 112
WIDTH = 112
POOL = 2
# large: (64, 128, 224, 224) -> 256 ch, ~3 ms (1.9 TFLOP bf16) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 64, "IN_CHANNELS": 128, "OUT_CHANNELS": 256, "HEIGHT": 224, "WIDTH": 224}


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, pool: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False).to(torch.bfloat16)
        self.bias = nn.Parameter((0.1 * torch.randn(out_channels, 1, 1)).to(torch.bfloat16))
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x) + self.bias
        y = F.gelu(y)
        return F.max_pool2d(y, self.pool)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH, dtype=torch.bfloat16)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, POOL]
