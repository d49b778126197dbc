# expect: crashed
# task: matmul
# message: exit code 3
# why: the process exits with code 3 in the middle of the first correctness trial.
import os

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        os._exit(3)
