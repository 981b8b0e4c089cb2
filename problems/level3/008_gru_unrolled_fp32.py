"""Single-layer GRU unrolled over time in fp32, written with explicit gates (PyTorch's GRU
equations): x is (STEPS, BATCH, INPUT) = (64, 128, 512), h0 is (128, 1024); the input
projections for all steps are one GEMM, then 64 dependent steps each do a (128 x 1024) @
(1024 x 3072) GEMM and the gate math. Returns all hidden states, (64, 128, 1024)."""

import torch
import torch.nn as nn

STEPS = 64
BATCH = 128
INPUT = 512
HIDDEN = 1024
# large: T 80, B 256, in 512, hidden 1024, ~13 ms est. (measured on an H200 at T 112: 17.7 ms GRU, 18.8 ms LSTM,
# launch-bound steps ~0.16 ms each; bench/results/large-preset-times)
LARGE = {"STEPS": 80, "BATCH": 256}


class Model(nn.Module):
    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.hidden_size = hidden_size
        self.w_ih = nn.Linear(input_size, 3 * hidden_size)
        self.w_hh = nn.Linear(hidden_size, 3 * hidden_size)

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        gi_all = self.w_ih(x)
        h = h0
        outputs = []
        for t in range(x.shape[0]):
            gi_r, gi_z, gi_n = gi_all[t].chunk(3, dim=-1)
            gh_r, gh_z, gh_n = self.w_hh(h).chunk(3, dim=-1)
            r = torch.sigmoid(gi_r + gh_r)
            z = torch.sigmoid(gi_z + gh_z)
            n = torch.tanh(gi_n + r * gh_n)
            h = (1.0 - z) * n + z * h
            outputs.append(h)
        return torch.stack(outputs, dim=0)


def get_inputs():
    return [torch.randn(STEPS, BATCH, INPUT), torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return [INPUT, HIDDEN]
