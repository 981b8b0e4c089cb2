"""The trivial benchmark command of the warm-worker benchmark: allocate, one matmul, exit."""
import torch

a = torch.randn(1024, 1024, device="cuda")
b = a @ a
torch.cuda.synchronize()
assert b.shape == (1024, 1024)
