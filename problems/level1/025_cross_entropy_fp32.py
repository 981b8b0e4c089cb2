"""Mean cross-entropy loss of fp32 logits (TOKENS, VOCAB) = (4096, 32000) against int64 class
targets (TOKENS,): loss = mean_t (logsumexp(x_t) - x_t[target_t]), returned as a scalar.
Fuses a log-softmax, a gather and a mean."""

import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 4096
VOCAB = 32000
# large: logits (32768, 32000), ~0.9 ms (3.9 GiB read) est. on an H200 (roofline, not measured)
LARGE = {"TOKENS": 32768}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, targets, reduction="mean")


def get_inputs():
    return [torch.randn(TOKENS, VOCAB), torch.randint(0, VOCAB, (TOKENS,))]


def get_init_inputs():
    return []
