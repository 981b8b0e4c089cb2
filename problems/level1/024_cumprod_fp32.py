"""Inclusive prefix product along the last dimension of an fp32 matrix of shape
(ROWS, COLS) = (8192, 4096): y[r, c] = prod_{j <= c} x[r, j]. Inputs are drawn close to 1
(1 + 0.001 * randn) so the running products stay finite and well-conditioned."""

import torch
import torch.nn as nn

ROWS = 8192
COLS = 4096
# large: (131072, 8192), ~1.8 ms (4 GiB in + out) est. on an H200 (roofline, not measured)
LARGE = {"ROWS": 131072, "COLS": 8192}


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumprod(x, dim=self.dim)


def get_inputs():
    return [1.0 + 0.001 * torch.randn(ROWS, COLS)]


def get_init_inputs():
    return [1]
