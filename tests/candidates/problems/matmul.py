"""fp32 matrix product (verify corpus): precision cuts show here."""
import torch
import torch.nn as nn

M, N, K = 64, 64, 128


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
