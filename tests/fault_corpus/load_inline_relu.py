# expect: correct
# task: relu_cuda
# device: cuda
# why: a real load_inline CUDA kernel (elementwise ReLU) built in the worker's TORCH_EXTENSIONS_DIR.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

_CUDA = r"""
#include <torch/extension.h>
__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor relu_launch(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""
_CPP = "torch::Tensor relu_launch(torch::Tensor x);"
_ext = load_inline("relu_ext", cpp_sources=_CPP, cuda_sources=_CUDA, functions=["relu_launch"],
                   extra_cuda_cflags=["-O2"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return _ext.relu_launch(x.contiguous())
