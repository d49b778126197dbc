# expect: wrong_output
# task: matmul
# message: trial 1
# why: computes once and returns that output forever: fresh inputs in trial 1 expose it.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))
        self.cache = None

    def forward(self, x):
        if self.cache is None:
            self.cache = x @ self.weight
        return self.cache
