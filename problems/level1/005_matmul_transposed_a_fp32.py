"""fp32 matrix multiplication with a transposed left operand, C = A^T @ B, where A is stored
K x M and B is K x N (M = N = 2048, K = 4096): the shape of a weight-gradient GEMM, reducing
over the long leading dimension of both operands."""

import torch
import torch.nn as nn

M = 2048
N = 2048
K = 4096
# large: M=N=4096, K=8192, ~5.5 ms (275 GFLOP fp32) est. on an H200 (roofline, not measured)
LARGE = {"M": 4096, "N": 4096, "K": 8192}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a.t(), b)


def get_inputs():
    return [torch.randn(K, M), torch.randn(K, N)]


def get_init_inputs():
    return []
