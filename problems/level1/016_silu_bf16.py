"""SiLU (swish) applied elementwise to a bf16 tensor of shape (32768, 4096), i.e. 128 Mi
elements: y = x * sigmoid(x). Bandwidth-bound; the sigmoid should be computed in fp32."""

import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 32768
COLS = 4096
# large: (393216, 4096), ~1.3 ms (3 GiB in + out) est. on an H200 (roofline, not measured)
LARGE = {"ROWS": 393216}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


def get_inputs():
    return [torch.randn(ROWS, COLS, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
