"""Cheat (exploit 13 in native code: torch does the work, called from C++ — at::add and
torch::relu on the inputs, which the static gate cannot read). The dispatch record's
TorchDispatchMode sees every dispatcher call of the thread, C++ ones included. Expect
dispatch:torch-compute naming aten::add and aten::relu."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SOURCE = r"""
#include <torch/extension.h>

torch::Tensor vector_add(torch::Tensor x, torch::Tensor y) {
    // relu(s) - relu(-s) == s: the sum, computed by aten ops.
    auto s = at::add(x, y);
    return torch::relu(s) - torch::relu(-s);
}
"""

native = load_inline(name="kforge_corpus_native_at_compute", cpp_sources=CPP_SOURCE, functions=["vector_add"],
                     extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.native = native

    def forward(self, x, y):
        return self.native.vector_add(x, y)
