"""Tall-skinny fp32 matrix multiplication C = A @ B where A is M x K with M much larger than
K (M = 131072, K = 256) and B is K x N (N = 256). Low arithmetic intensity: the cost is
dominated by streaming A in and C out, so tile shapes tuned for square GEMMs waste bandwidth."""

import torch
import torch.nn as nn

M = 131072
K = 256
N = 256
# large: M=1048576, ~3 ms (137 GFLOP fp32) est. on an H200 (roofline, not measured)
LARGE = {"M": 1048576}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
