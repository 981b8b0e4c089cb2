"""One pre-norm transformer encoder layer in bf16: x = x + MHA(LN(x)); x = x + FFN(LN(x)) with a
GELU feed-forward network of width 4096, for x of shape (BATCH, SEQ, DIM) = (8, 1024, 1024)
and 16 heads of 64, no mask. About 0.24 TFLOP: GEMMs, attention and norms."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 8
SEQ = 1024
DIM = 1024
HEADS = 16
FFN = 4096
# large: (16, 2048, 2048), 16 heads, FFN 8192, ~5.5 ms (3.9 TFLOP bf16) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 16, "SEQ": 2048, "DIM": 2048, "FFN": 8192}


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        qkv = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        probs = torch.softmax(scores.float(), dim=-1).to(x.dtype)
        return self.out(torch.matmul(probs, v).transpose(1, 2).reshape(b, s, d))


class Model(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, ffn)
        self.fc2 = nn.Linear(ffn, dim)
        self.to(torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


def get_inputs():
    return [torch.randn(BATCH, SEQ, DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return [DIM, HEADS, FFN]
