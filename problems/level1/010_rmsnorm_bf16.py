"""RMS normalization (as in LLaMA) of bf16 activations of shape (TOKENS, HIDDEN) =
(16384, 4096): y = x / sqrt(mean(x^2) + eps) * weight, with the statistics computed in fp32
and the result cast back to bf16. The weight is a learned bf16 vector of length HIDDEN."""

import torch
import torch.nn as nn

TOKENS = 16384
HIDDEN = 4096
EPS = 1e-6
# large: (393216, 4096), ~1.3 ms (3 GiB in + 3 GiB out) est. on an H200 (roofline, not measured)
LARGE = {"TOKENS": 393216}


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.weight = nn.Parameter((1.0 + 0.1 * torch.randn(hidden)).to(torch.bfloat16))
        self.eps = EPS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        rms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (xf * rms).to(x.dtype) * self.weight


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)]


def get_init_inputs():
    return [HIDDEN]
