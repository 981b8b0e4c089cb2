"""Multi-head self-attention block in bf16 (no mask): a fused QKV projection, per-head
softmax(Q K^T / sqrt(d)) V and an output projection, for x of shape (BATCH, SEQ, DIM) =
(8, 1024, 1024) with 16 heads of 64. Softmax statistics are taken in fp32."""

import math

import torch
import torch.nn as nn

BATCH = 8
SEQ = 1024
DIM = 1024
HEADS = 16
# large: (16, 2048, 2048), 16 heads, ~2.5 ms (1.65 TFLOP bf16) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 16, "SEQ": 2048, "DIM": 2048}


class Model(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        probs = torch.softmax(scores.float(), dim=-1).to(x.dtype)
        ctx = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, d)
        return self.out(ctx)


def get_inputs():
    return [torch.randn(BATCH, SEQ, DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return [DIM, HEADS]
