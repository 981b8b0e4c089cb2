"""LayerNorm + GELU + residual in fp32: y = x + gelu(layernorm(x)) for x of shape
(TOKENS, HIDDEN) = (16384, 2048). Three row-local steps that one kernel can do in a single
read of x and a single write of y."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 16384
HIDDEN = 2048
# large: (262144, 2048), ~0.9 ms (2 GiB in + out) est. on an H200 (roofline, not measured)
LARGE = {"TOKENS": 262144}


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.1, 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.norm(x))


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return [HIDDEN]
