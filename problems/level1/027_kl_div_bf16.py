"""KL divergence KL(target || input) in bf16 with batchmean reduction: input holds
log-probabilities and target probabilities, both (ROWS, CLASSES) = (8192, 8192) rows of a
softmax; loss = sum(target * (log(target) - input)) / ROWS, a scalar."""

import torch
import torch.nn as nn
import torch.nn.functional as F

ROWS = 8192
CLASSES = 8192
# large: 2 x (32768, 32768), ~0.9 ms (4 GiB read) est. on an H200 (roofline, not measured)
LARGE = {"ROWS": 32768, "CLASSES": 32768}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, log_probs: torch.Tensor, target_probs: torch.Tensor) -> torch.Tensor:
        return F.kl_div(log_probs, target_probs, reduction="batchmean")


def get_inputs():
    log_probs = torch.log_softmax(torch.randn(ROWS, CLASSES), dim=-1).to(torch.bfloat16)
    target_probs = torch.softmax(torch.randn(ROWS, CLASSES), dim=-1).to(torch.bfloat16)
    return [log_probs, target_probs]


def get_init_inputs():
    return []
