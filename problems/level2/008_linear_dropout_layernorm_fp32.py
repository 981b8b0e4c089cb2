"""Linear + dropout (eval mode, an identity) + LayerNorm in fp32: y = layernorm(x @ W^T + b)
with x of shape (TOKENS, IN_FEATURES) = (16384, 1024) and W of shape (4096, 1024). The
dropout is called with training=False so the result is deterministic; a kernel may drop it."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 16384
IN_FEATURES = 1024
OUT_FEATURES = 4096
# large: TOKENS=32768, ~5.5 ms (275 GFLOP fp32) est. on an H200 (roofline, not measured)
LARGE = {"TOKENS": 32768}


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, p: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.norm = nn.LayerNorm(out_features)
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        y = F.dropout(y, p=self.p, training=False)
        return self.norm(y)


def get_inputs():
    return [torch.randn(TOKENS, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES, 0.1]
