"""Gated (SwiGLU) MLP in bf16: y = (silu(x @ W1^T) * (x @ W3^T)) @ W2^T, no biases, with x of
shape (TOKENS, HIDDEN) = (4096, 2048) and an intermediate size of 5632. The two up-projections
share their input and the gate product can be formed in their epilogue."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 4096
HIDDEN = 2048
INTERMEDIATE = 5632
# large: x (16384, 4096), intermediate 11008, ~6.3 ms (4.4 TFLOP bf16) est. on an H200 (roofline, not measured)
LARGE = {"TOKENS": 16384, "HIDDEN": 4096, "INTERMEDIATE": 11008}


class Model(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, intermediate, bias=False).to(torch.bfloat16)
        self.w3 = nn.Linear(hidden, intermediate, bias=False).to(torch.bfloat16)
        self.w2 = nn.Linear(intermediate, hidden, bias=False).to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN, INTERMEDIATE]
