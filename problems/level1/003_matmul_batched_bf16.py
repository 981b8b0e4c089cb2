"""Batched bf16 matrix multiplication C[b] = A[b] @ B[b] for BATCH = 32 independent
1024 x 1024 x 1024 products (torch.bmm), accumulating in fp32 and returning bf16."""

import torch
import torch.nn as nn

BATCH = 32
M = 1024
K = 1024
N = 1024
# large: BATCH=128, M=K=N=2048, ~3 ms (2.2 TFLOP bf16) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 128, "M": 2048, "K": 2048, "N": 2048}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.bmm(a, b)


def get_inputs():
    return [
        torch.randn(BATCH, M, K, dtype=torch.bfloat16),
        torch.randn(BATCH, K, N, dtype=torch.bfloat16),
    ]


def get_init_inputs():
    return []
