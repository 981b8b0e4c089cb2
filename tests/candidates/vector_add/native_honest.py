"""Honest native: a C++ element-wise add over the inputs' data pointers, compiled with
torch.utils.cpp_extension.load_inline (KernelBench's most common candidate format)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SOURCE = r"""
#include <torch/extension.h>

torch::Tensor vector_add(torch::Tensor x, torch::Tensor y) {
    TORCH_CHECK(x.device().is_cpu() && y.device().is_cpu(), "CPU inputs expected (a C++ loop over host memory)");
    TORCH_CHECK(x.is_contiguous() && y.is_contiguous(), "contiguous inputs expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat && y.scalar_type() == torch::kFloat, "float32 inputs expected");
    TORCH_CHECK(x.numel() == y.numel(), "inputs of one size expected");
    auto out = torch::empty_like(x);
    const float* a = x.data_ptr<float>();
    const float* b = y.data_ptr<float>();
    float* o = out.data_ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
        o[i] = a[i] + b[i];
    }
    return out;
}
"""

native = load_inline(name="kforge_corpus_native_honest", cpp_sources=CPP_SOURCE, functions=["vector_add"],
                     extra_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        return native.vector_add(x, y)
