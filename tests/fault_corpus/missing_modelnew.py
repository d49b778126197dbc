# expect: compile_error
# task: matmul
# message: no ModelNew
# why: defines a model under the wrong name, so there is no ModelNew to build.
import torch
import torch.nn as nn


class FastModel(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        return x @ self.weight
