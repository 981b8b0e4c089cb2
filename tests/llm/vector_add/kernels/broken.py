"""A candidate that does not parse (an unclosed call): the executor's static check catches it."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return add(x, y
