# expect: wrong_output
# task: matmul
# message: not allclose
# why: uses the transposed weight: right shape, wrong numbers.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        return x @ self.weight.t()
