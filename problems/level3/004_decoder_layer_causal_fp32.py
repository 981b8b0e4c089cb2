"""One pre-norm transformer decoder layer in fp32: causal self-attention, cross-attention to an
encoder memory, and a GELU feed-forward network, each with a residual. x is (BATCH, SEQ, DIM) =
(4, 1024, 768), memory is (4, MEM_SEQ, 768) with MEM_SEQ = 512, 12 heads of 64, FFN width 3072.
The causal mask is built on the input's device inside forward."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 4
SEQ = 1024
MEM_SEQ = 512
DIM = 768
HEADS = 12
FFN = 3072
# large: x (4, 2048, 1024), memory (4, 1024, 1024), 16 heads, FFN 4096, ~7 ms (360 GFLOP fp32) est. on an H200 (roofline, not measured)
LARGE = {"SEQ": 2048, "MEM_SEQ": 1024, "DIM": 1024, "HEADS": 16, "FFN": 4096}


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, causal: bool) -> torch.Tensor:
        b, s, d = x.shape
        t = ctx.shape[1]
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        kv = self.kv(ctx).view(b, t, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        k, v = kv[0], kv[1]
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        if causal:
            mask = torch.triu(torch.ones(s, t, device=x.device), diagonal=1).bool()
            scores = scores.masked_fill(mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return self.out(torch.matmul(probs, v).transpose(1, 2).reshape(b, s, d))


class Model(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.self_attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.cross_attn = Attention(dim, heads)
        self.norm3 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, ffn)
        self.fc2 = nn.Linear(ffn, dim)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.self_attn(h, h, causal=True)
        x = x + self.cross_attn(self.norm2(x), memory, causal=False)
        return x + self.fc2(F.gelu(self.fc1(self.norm3(x))))


def get_inputs():
    return [torch.randn(BATCH, SEQ, DIM), torch.randn(BATCH, MEM_SEQ, DIM)]


def get_init_inputs():
    return [DIM, HEADS, FFN]
