"""Residual add + LayerNorm in bf16, as between sub-layers of a post-norm transformer:
y = layernorm(x + residual) with x and residual of shape (TOKENS, HIDDEN) = (16384, 4096),
statistics in fp32 inside nn.LayerNorm, affine weight and bias in bf16."""

import torch
import torch.nn as nn

TOKENS = 16384
HIDDEN = 4096
# large: 2 x (262144, 4096), ~1.3 ms (4 GiB in + 2 GiB out) est. on an H200 (roofline, not measured)
LARGE = {"TOKENS": 262144}


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.1, 0.1)
        self.norm.to(torch.bfloat16)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.norm(x + residual)


def get_inputs():
    return [
        torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16),
        torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16),
    ]


def get_init_inputs():
    return [HIDDEN]
