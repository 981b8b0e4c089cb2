"""diag(a) @ B in fp32 (verify corpus): torch.compile keeps the dense GEMM; scaling the rows is
the same result for every input with far less work — the "genuinely faster" honest candidate."""
import torch
import torch.nn as nn

N = 1024


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.diag(a) @ b


def get_inputs():
    return [torch.randn(N), torch.randn(N, N)]


def get_init_inputs():
    return []
