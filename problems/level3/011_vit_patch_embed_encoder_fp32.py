"""Vision-transformer front end in fp32: (32, 3, 224, 224) images are cut into 16 x 16 patches by
a stride-16 convolution to 768 channels (196 tokens), a class token is prepended and learned
position embeddings added, then one pre-norm encoder layer (12 heads of 64, GELU FFN of width
3072) and a final LayerNorm. Returns (32, 197, 768) token features."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32
IMAGE = 224
PATCH = 16
DIM = 768
HEADS = 12
FFN = 3072
# large: (128, 3, 224, 224), ~8 ms (400 GFLOP fp32) est. on an H200 (roofline, not measured)
LARGE = {"BATCH": 128}


class Model(nn.Module):
    def __init__(self, image: int, patch: int, dim: int, heads: int, ffn: int):
        super().__init__()
        tokens = (image // patch) ** 2 + 1
        self.heads = heads
        self.head_dim = dim // heads
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(0.02 * torch.randn(1, 1, dim))
        self.pos_embed = nn.Parameter(0.02 * torch.randn(1, tokens, dim))
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, ffn)
        self.fc2 = nn.Linear(ffn, dim)
        self.norm_out = nn.LayerNorm(dim)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(images).flatten(2).transpose(1, 2)
        b = x.shape[0]
        x = torch.cat([self.cls_token.expand(b, -1, -1), x], dim=1) + self.pos_embed
        s, d = x.shape[1], x.shape[2]
        qkv = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        ctx = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(ctx)
        x = x + self.fc2(F.gelu(self.fc1(self.norm2(x))))
        return self.norm_out(x)


def get_inputs():
    return [torch.randn(BATCH, 3, IMAGE, IMAGE)]


def get_init_inputs():
    return [IMAGE, PATCH, DIM, HEADS, FFN]
