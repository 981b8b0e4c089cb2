"""Honest native CUDA (GPU only): a CUDA C++ element-wise add compiled with load_inline
(cuda_sources), launched on PyTorch's current stream (at::cuda::getCurrentCUDAStream)."""
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

torch::Tensor vector_add(torch::Tensor x, torch::Tensor y) {
    TORCH_CHECK(x.is_cuda() && y.is_cuda(), "CUDA inputs expected");
    TORCH_CHECK(x.is_contiguous() && y.is_contiguous(), "contiguous inputs expected");
    TORCH_CHECK(x.scalar_type() == torch::kFloat && y.scalar_type() == torch::kFloat, "float32 inputs expected");
    auto out = torch::empty_like(x);
    const int64_t n = x.numel();
    const int threads = 256;
    const int64_t blocks = (n + threads - 1) / threads;
    if (blocks > 0) {
        vector_add_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
            x.data_ptr<float>(), y.data_ptr<float>(), out.data_ptr<float>(), n);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    return out;
}
"""

CPP_SOURCE = "torch::Tensor vector_add(torch::Tensor x, torch::Tensor y);"

native = load_inline(name="kforge_corpus_native_cuda_honest", cpp_sources=CPP_SOURCE, cuda_sources=CUDA_SOURCE,
                     functions=["vector_add"], extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.native = native

    def forward(self, x, y):
        return self.native.vector_add(x, y)
