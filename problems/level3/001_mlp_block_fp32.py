"""Residual MLP block in fp32: y = x + W3 gelu(W2 gelu(W1 layernorm(x))) with biases, for x of
shape (TOKENS, DIM) = (4096, 1024) and hidden widths 4096 and 4096 (layers 1024 -> 4096 ->
4096 -> 1024). Three GEMMs with activation epilogues, a norm in front and a residual at the end."""

import torch
import torch.nn as nn

TOKENS = 4096
DIM = 1024
HIDDEN = 4096
# large: x (8192, 1024), ~8 ms (414 GFLOP fp32) est. on an H200 (roofline, not measured)
LARGE = {"TOKENS": 8192}


class Model(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


def get_inputs():
    return [torch.randn(TOKENS, DIM)]


def get_init_inputs():
    return [DIM, HIDDEN]
