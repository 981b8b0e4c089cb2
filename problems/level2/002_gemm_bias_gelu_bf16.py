"""Transformer FFN up-projection in bf16: y = gelu_tanh(x @ W^T + b), x of shape
(TOKENS, HIDDEN) = (8192, 4096), W of shape (FFN, HIDDEN) = (16384, 4096). About 1.1 TFLOP;
the tanh-approximated GELU should run in the GEMM epilogue."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 8192
HIDDEN = 4096
FFN = 16384
# large: TOKENS=32768, ~6.3 ms (4.4 TFLOP bf16) est. on an H200 (roofline, not measured)
LARGE = {"TOKENS": 32768}


class Model(nn.Module):
    def __init__(self, hidden: int, ffn: int):
        super().__init__()
        self.linear = nn.Linear(hidden, ffn).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.linear(x), approximate="tanh")


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN, FFN]
