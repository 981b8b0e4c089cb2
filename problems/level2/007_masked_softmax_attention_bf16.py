"""Scaled dot-product attention with a key-padding mask in bf16: out = softmax(Q K^T / sqrt(d)
with masked keys set to -inf) @ V, for Q, K, V of shape (BATCH, HEADS, SEQ, HEAD_DIM) =
(16, 16, 1024, 64) and a boolean mask (BATCH, SEQ) that keeps a random-length prefix of at
least SEQ / 2 keys per sequence. Written unfused, it materialises the (16, 16, 1024, 1024)
score tensor; a flash-style kernel never does."""

import math

import torch
import torch.nn as nn

BATCH = 16
HEADS = 16
SEQ = 1024
HEAD_DIM = 64
# large: B 4, H 16, S 4096, d 128, ~2 ms (550 GFLOP bf16; 2 GiB score matrix) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 4, "SEQ": 4096, "HEAD_DIM": 128}


class Model(nn.Module):
    def __init__(self, head_dim: int):
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                key_mask: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        return torch.matmul(probs, v)


def get_inputs():
    shape = (BATCH, HEADS, SEQ, HEAD_DIM)
    lengths = torch.randint(SEQ // 2, SEQ + 1, (BATCH, 1))
    key_mask = torch.arange(SEQ)[None, :] < lengths
    return [
        torch.randn(shape, dtype=torch.bfloat16),
        torch.randn(shape, dtype=torch.bfloat16),
        torch.randn(shape, dtype=torch.bfloat16),
        key_mask,
    ]


def get_init_inputs():
    return [HEAD_DIM]
