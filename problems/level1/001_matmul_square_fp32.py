"""Square fp32 matrix multiplication C = A @ B with A, B and C all N x N (N = 4096). The baseline
dense GEMM of the suite: compute-bound, ~137 GFLOP per forward."""

import torch
import torch.nn as nn

N = 4096
# large: N=6144, ~9 ms (fp32 GEMM 464 GFLOP) est. on an H200 (roofline, not measured)
LARGE = {"N": 6144}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs():
    return []
