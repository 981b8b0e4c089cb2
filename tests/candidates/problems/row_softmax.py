"""Softmax over the last dimension of an fp32 matrix (verify corpus)."""
import torch
import torch.nn as nn

ROWS, COLS = 64, 256


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS)]


def get_init_inputs():
    return []
