"""2-D average pooling in bf16 with a 2 x 2 window and stride 2 (non-overlapping) on NCHW input
(32, 256, 112, 112), giving (32, 256, 56, 56). Reads 196 MiB and writes a quarter of that."""

import torch
import torch.nn as nn

BATCH = 32
CHANNELS = 256
HEIGHT = 112
WIDTH = 112
KERNEL = 2
# large: (128, 256, 224, 224), ~0.9 ms (3.1 GiB in) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 128, "HEIGHT": 224, "WIDTH": 224}


class Model(nn.Module):
    def __init__(self, kernel: int):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel, stride=kernel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH, dtype=torch.bfloat16)]


def get_init_inputs():
    return [KERNEL]
