"""relu(diag(a) @ B) in fp32, small (kforge optimize's rewrite agent): the diagonal operand makes the
dense GEMM a row scaling (rule diag-matmul, exact); the relu stays the reference's own op."""
import torch
import torch.nn as nn

N = 96


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.relu(torch.diag(a) @ b)


def get_inputs():
    return [torch.randn(N), torch.randn(N, N)]


def get_init_inputs():
    return []
