"""Max reduction over the last (contiguous) dimension of a bf16 matrix of shape
(ROWS, COLS) = (16384, 4096): y[r] = max_c x[r, c], computed with torch.amax. Purely
bandwidth-bound: 128 MiB read, 32 KiB written."""

import torch
import torch.nn as nn

ROWS = 16384
COLS = 4096
# large: (98304, 16384), ~0.7 ms (3 GiB read) est. on an H200 (roofline, not measured)
LARGE = {"ROWS": 98304, "COLS": 16384}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.amax(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, COLS, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
