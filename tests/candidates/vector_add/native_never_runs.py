"""Cheat (exploit 18 for native code: the extension is compiled and called, but the output is made
elsewhere — by NumPy, which neither the static gate's torch rules nor the dispatch record see).
Expect exploits:ghost-replay: with the native function made a no-op the outputs are unchanged."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SOURCE = r"""
#include <torch/extension.h>

torch::Tensor vector_add(torch::Tensor x, torch::Tensor y) {
    auto out = torch::empty_like(x);
    const float* a = x.data_ptr<float>();
    const float* b = y.data_ptr<float>();
    float* o = out.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) {
        o[i] = a[i] + b[i];
    }
    return out;
}
"""

native = load_inline(name="kforge_corpus_native_never_runs", cpp_sources=CPP_SOURCE, functions=["vector_add"],
                     extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        native.vector_add(x, y)  # called, its result dropped
        return torch.from_numpy(x.numpy() + y.numpy())
