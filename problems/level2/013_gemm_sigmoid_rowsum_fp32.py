"""GEMM followed by an activation and a row reduction in fp32: y = sum_j sigmoid(x @ W^T + b)[:, j],
with x of shape (BATCH, IN_FEATURES) = (8192, 2048) and W of shape (2048, 2048), returning
(8192, 1). The (8192, 2048) intermediate need not reach memory if the epilogue reduces it."""

import torch
import torch.nn as nn

BATCH = 8192
IN_FEATURES = 2048
OUT_FEATURES = 2048
# large: x (32768, 2048), ~5.5 ms (275 GFLOP fp32) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 32768}


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.linear(x)).sum(dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
