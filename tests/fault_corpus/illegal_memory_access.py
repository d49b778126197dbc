# expect: crashed|runtime_error
# task: relu_cuda
# device: cuda
# why: a load_inline kernel that writes far outside its output buffer: illegal memory access
#      (a sticky CUDA error: the context is gone, the next evaluation needs a fresh worker).
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <torch/extension.h>
__global__ void bad_relu(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i + (1L << 40)] = x[i] > 0.f ? x[i] : 0.f;   // far out of bounds
}
torch::Tensor bad_relu_launch(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    bad_relu<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
_CPP = "torch::Tensor bad_relu_launch(torch::Tensor x);"
_ext = load_inline("bad_relu_ext", cpp_sources=_CPP, cuda_sources=_CUDA, functions=["bad_relu_launch"],
                   extra_cuda_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return _ext.bad_relu_launch(x.contiguous())
