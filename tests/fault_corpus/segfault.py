# expect: crashed
# task: matmul
# message: SIGSEGV
# why: reads address 0 through ctypes: SIGSEGV.
import ctypes

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        ctypes.string_at(0)
        return x @ self.weight
