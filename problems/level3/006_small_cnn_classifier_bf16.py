"""Small CNN image classifier in bf16 on (32, 3, 224, 224) images: a 7 x 7 stride-2 stem
(3 -> 64) with eval-mode batch norm, ReLU and a 3 x 3 stride-2 max pool, then three 3 x 3
stride-2 conv + BN + ReLU stages (64 -> 128 -> 256 -> 512, down to 7 x 7), global average
pooling and a linear layer to 1000 logits."""

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32
IMAGE = 224
NUM_CLASSES = 1000
# large: (512, 3, 224, 224), ~1.5 ms (300 GFLOP bf16, conv-efficiency bound) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 512}


class ConvBNReLU(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2, bias=False)
        self.weight = nn.Parameter(torch.rand(cout) + 0.5)
        self.bias = nn.Parameter(0.1 * torch.randn(cout))
        self.register_buffer("running_mean", 0.1 * torch.randn(cout))
        self.register_buffer("running_var", torch.rand(cout) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.batch_norm(self.conv(x), self.running_mean, self.running_var, self.weight,
                         self.bias, training=False, eps=1e-5)
        return torch.relu(y)


class Model(nn.Module):
    def __init__(self, num_classes: int):
        super().__init__()
        self.stem = ConvBNReLU(3, 64, 7, 2)
        self.stages = nn.Sequential(
            ConvBNReLU(64, 128, 3, 2),
            ConvBNReLU(128, 256, 3, 2),
            ConvBNReLU(256, 512, 3, 2),
        )
        self.fc = nn.Linear(512, num_classes)
        self.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(self.stem(x), 3, stride=2, padding=1)
        x = self.stages(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def get_inputs():
    return [torch.randn(BATCH, 3, IMAGE, IMAGE, dtype=torch.bfloat16)]


def get_init_inputs():
    return [NUM_CLASSES]
