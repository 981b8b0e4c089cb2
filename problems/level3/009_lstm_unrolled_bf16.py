"""Single-layer LSTM unrolled over time in bf16 with explicit gates: x is (STEPS, BATCH, INPUT)
= (64, 128, 512), initial states h0 and c0 are (128, 1024). Input projections for all steps
are one GEMM; each of the 64 dependent steps does a (128 x 1024) @ (1024 x 4096) GEMM and the
i/f/g/o gate math, keeping the cell state in fp32. Returns all hidden states, (64, 128, 1024)."""

import torch
import torch.nn as nn

STEPS = 64
BATCH = 128
INPUT = 512
HIDDEN = 1024
# large: T 80, B 256, in 1024, hidden 2048, ~13 ms est. (measured on an H200 at T 112: 17.7 ms GRU, 18.8 ms LSTM,
# launch-bound steps ~0.16 ms each; bench/results/large-preset-times)
LARGE = {"STEPS": 80, "BATCH": 256, "INPUT": 1024, "HIDDEN": 2048}


class Model(nn.Module):
    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.w_ih = nn.Linear(input_size, 4 * hidden_size).to(torch.bfloat16)
        self.w_hh = nn.Linear(hidden_size, 4 * hidden_size).to(torch.bfloat16)

    def forward(self, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor) -> torch.Tensor:
        gi_all = self.w_ih(x)
        h = h0
        c = c0.float()
        outputs = []
        for t in range(x.shape[0]):
            gates = (gi_all[t] + self.w_hh(h)).float()
            i, f, g, o = gates.chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = (torch.sigmoid(o) * torch.tanh(c)).to(x.dtype)
            outputs.append(h)
        return torch.stack(outputs, dim=0)


def get_inputs():
    return [
        torch.randn(STEPS, BATCH, INPUT, dtype=torch.bfloat16),
        torch.randn(BATCH, HIDDEN, dtype=torch.bfloat16),
        torch.randn(BATCH, HIDDEN, dtype=torch.bfloat16),
    ]


def get_init_inputs():
    return [INPUT, HIDDEN]
