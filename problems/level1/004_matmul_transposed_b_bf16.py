"""bf16 matrix multiplication with a transposed right operand, C = A @ B^T, where A is M x K
and B is stored N x K (row-major, as nn.Linear stores its weight). M = 8192, N = 4096,
K = 2048. The kernel must read B along its contiguous K dimension."""

import torch
import torch.nn as nn

M = 8192
N = 4096
K = 2048
# large: M=N=16384, K=8192, ~6 ms (4.4 TFLOP bf16) est. on an H200 (roofline, not measured)
LARGE = {"M": 16384, "N": 16384, "K": 8192}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b.t())


def get_inputs():
    return [torch.randn(M, K, dtype=torch.bfloat16), torch.randn(N, K, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
