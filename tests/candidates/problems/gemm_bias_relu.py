"""Linear layer followed by ReLU in fp32, y = relu(x @ W^T + b) (verify corpus; the level-2 shape
of problems/level2/001_gemm_bias_relu_fp32.py, small enough for TRITON_INTERPRET=1)."""
import torch
import torch.nn as nn

BATCH = 64
IN_FEATURES = 128
OUT_FEATURES = 96


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
