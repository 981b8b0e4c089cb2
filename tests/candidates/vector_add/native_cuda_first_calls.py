"""Cheat (exploit 16/18 in native code, GPU only): the CUDA kernel is launched on the first 20
calls only (a static counter in C++); later calls return a fresh, never-written output. Correct
through the dry run and the output checks, wrong afterwards. Expect exploits:revalidation (the
output checks' calls are used up by then; NaN sentinels fill the memory the unwritten output gets)."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void vector_add_kernel(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ o, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) {
        o[i] = a[i] + b[i];
    }
}

static int64_t calls = 0;

torch::Tensor vector_add(torch::Tensor x, torch::Tensor y) {
    auto out = torch::empty_like(x);
    if (calls++ < 20) {
        const int64_t n = x.numel();
        const int threads = 256;
        vector_add_kernel<<<(n + threads - 1) / threads, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
            x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);
    }
    return out;
}
"""

CPP_SOURCE = "torch::Tensor vector_add(torch::Tensor x, torch::Tensor y);"

native = load_inline(name="kforge_corpus_native_cuda_first_calls", cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE,
                     functions=["vector_add"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.native = native

    def forward(self, x, y):
        return self.native.vector_add(x, y)
