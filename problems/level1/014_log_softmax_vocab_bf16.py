"""Log-softmax over a vocabulary-sized last dimension of bf16 logits of shape (ROWS, VOCAB) =
(4096, 32768): y = x - logsumexp(x). Rows are long (64 KiB each), so one row does not fit a
single warp's registers."""

import torch
import torch.nn as nn

ROWS = 4096
VOCAB = 32768
# large: (32768, 49152), ~1.3 ms (3 GiB in + out) est. on an H200 (roofline, not measured)
LARGE = {"ROWS": 32768, "VOCAB": 49152}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(ROWS, VOCAB, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
