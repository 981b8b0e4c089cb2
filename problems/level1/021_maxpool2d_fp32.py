"""2-D max pooling in fp32 with a 3 x 3 window, stride 2, padding 1 (the ResNet stem pool) on
NCHW input (32, 128, 112, 112), giving (32, 128, 56, 56). Overlapping windows: each input is
read by up to four outputs."""

import torch
import torch.nn as nn

BATCH = 32
CHANNELS = 128
HEIGHT = 112
WIDTH = 112
KERNEL = 3
STRIDE = 2
PADDING = 1
# large: (64, 256, 224, 224), ~0.9 ms (3.1 GiB in) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 64, "CHANNELS": 256, "HEIGHT": 224, "WIDTH": 224}


class Model(nn.Module):
    def __init__(self, kernel: int, stride: int, padding: int):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel, stride=stride, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(x)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [KERNEL, STRIDE, PADDING]
