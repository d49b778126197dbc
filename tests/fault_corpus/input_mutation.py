# expect: suspicious
# task: matmul
# message: modified its inputs
# why: right answer, but it zeroes its input afterwards (the reference leaves its inputs alone).
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        out = x @ self.weight
        x.zero_()
        return out
