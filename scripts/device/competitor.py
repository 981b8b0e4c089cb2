"""A competing GPU process: bf16 8192^3 matmuls in a loop, queueing work ahead.

Usage: python3 competitor.py READY_FILE
Writes READY_FILE once it is submitting work; runs until killed.
"""
from __future__ import annotations

import sys

import torch

a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    a @ b
torch.cuda.synchronize()
open(sys.argv[1], "w").close()
i = 0
while True:
    c = a @ b
    i += 1
    if i % 64 == 0:
        torch.cuda.synchronize()
