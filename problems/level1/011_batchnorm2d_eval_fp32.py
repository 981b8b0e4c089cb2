"""2-D batch normalization with eval-mode semantics on fp32 NCHW activations of shape
(32, 128, 112, 112): y = (x - running_mean[c]) / sqrt(running_var[c] + eps) * weight[c] +
bias[c], using fixed (randomly initialised) running statistics, never batch statistics."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32
CHANNELS = 128
HEIGHT = 112
WIDTH = 112
# large: (128, 128, 224, 224), ~1.4 ms (3.1 GiB in + out) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 128, "HEIGHT": 224, "WIDTH": 224}


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(channels) + 0.5)
        self.bias = nn.Parameter(0.1 * torch.randn(channels))
        self.register_buffer("running_mean", 0.1 * torch.randn(channels))
        self.register_buffer("running_var", torch.rand(channels) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                            training=False, eps=1e-5)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [CHANNELS]
