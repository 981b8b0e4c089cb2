"""Linear layer followed by ReLU in fp32: y = relu(x @ W^T + b) with x of shape
(BATCH, IN_FEATURES) = (4096, 4096) and W of shape (4096, 4096). The bias add and activation
belong in the GEMM epilogue instead of two extra passes over the 64 MiB output."""

import torch
import torch.nn as nn

BATCH = 4096
IN_FEATURES = 4096
OUT_FEATURES = 4096
# large: x (8192, 4096), W (4096, 4096), ~5.5 ms (275 GFLOP fp32) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 8192}


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
