"""Layer normalization over the last dimension of fp32 activations of shape (TOKENS, HIDDEN) =
(8192, 4096), with learned elementwise affine weight and bias (nn.LayerNorm, eps = 1e-5).
Each row needs a mean and a variance before it can be normalized."""

import torch
import torch.nn as nn

TOKENS = 8192
HIDDEN = 4096
# large: (262144, 4096), ~1.8 ms (4 GiB in + 4 GiB out) est. on an H200 (roofline, not measured)
LARGE = {"TOKENS": 262144}


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden, eps=1e-5)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.1, 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return [HIDDEN]
