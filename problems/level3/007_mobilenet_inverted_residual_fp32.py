"""MobileNetV2-style inverted residual (depthwise-separable) block in fp32 on (32, 64, 56, 56):
1 x 1 expansion to 384 channels + BN + ReLU6, 3 x 3 depthwise convolution + BN + ReLU6,
1 x 1 projection back to 64 channels + BN, plus the identity shortcut. Batch norms use
eval-mode semantics. The 6x-wide intermediates dominate memory traffic."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32
CHANNELS = 64
EXPANSION = 6
HEIGHT = 56
WIDTH = 56
# large: (128, 128, 56, 56), hidden 768, ~3.2 ms (158 GFLOP fp32) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 128, "CHANNELS": 128}


class FrozenBatchNorm(nn.Module):
    """Batch norm that always uses its running statistics (eval-mode semantics)."""

    def __init__(self, channels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(channels) + 0.5)
        self.bias = nn.Parameter(0.1 * torch.randn(channels))
        self.register_buffer("running_mean", 0.1 * torch.randn(channels))
        self.register_buffer("running_var", torch.rand(channels) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=False, eps=1e-5)


class Model(nn.Module):
    def __init__(self, channels: int, expansion: int):
        super().__init__()
        hidden = channels * expansion
        self.expand = nn.Conv2d(channels, hidden, 1, bias=False)
        self.bn1 = FrozenBatchNorm(hidden)
        self.depthwise = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden, bias=False)
        self.bn2 = FrozenBatchNorm(hidden)
        self.project = nn.Conv2d(hidden, channels, 1, bias=False)
        self.bn3 = FrozenBatchNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self.bn1(self.expand(x)))
        y = F.relu6(self.bn2(self.depthwise(y)))
        return x + self.bn3(self.project(y))


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [CHANNELS, EXPANSION]
