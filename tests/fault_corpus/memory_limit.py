# expect: runtime_error
# task: matmul
# message: MemoryError
# config: {"memory_limit_gb": 2}
# why: 3 GiB of host memory under RLIMIT_AS = 2 GiB: MemoryError inside the worker (CPU only).
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        hog = bytearray(3 * 2**30)
        return x @ self.weight + len(hog) * 0
