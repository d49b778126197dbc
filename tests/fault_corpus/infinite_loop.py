# expect: timeout
# task: matmul
# message: during correctness trial 0
# config: {"timeout_s": 3}
# why: forward never returns; the worker's process group is killed at the timeout.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        while True:
            pass
