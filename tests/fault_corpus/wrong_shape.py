# expect: wrong_shape
# task: matmul
# message: shape (16, 31), expected (16, 32)
# why: drops the last output column.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        return (x @ self.weight)[:, :-1]
