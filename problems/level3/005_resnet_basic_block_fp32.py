"""ResNet basic block in fp32 with eval-mode batch norms: y = relu(bn2(conv2(relu(bn1(conv1(x)))))
+ x), two 3 x 3 convolutions of 64 channels with padding 1 and no bias, identity shortcut, on
input (32, 64, 56, 56) (the first stage of ResNet-18/34)."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32
CHANNELS = 64
HEIGHT = 56
WIDTH = 56
# large: (128, 128, 56, 56), ~4.7 ms (237 GFLOP fp32) est. on an H200 (roofline, not measured)
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
    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = FrozenBatchNorm(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = FrozenBatchNorm(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [CHANNELS]
