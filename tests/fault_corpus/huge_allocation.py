# expect: runtime_error
# task: matmul
# message: RuntimeError
# message_cuda: OutOfMemoryError
# why: asks for 40 TB; the allocator refuses (RuntimeError / OutOfMemoryError), the worker survives to report it.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        scratch = torch.empty(10**13, device=x.device)
        return x @ self.weight + scratch[0] * 0
