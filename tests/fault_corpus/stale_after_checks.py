# expect: wrong_output
# task: matmul
# message: last timed call
# why: correct for the 5 correctness trials, then returns its last output (fast and stale during timing):
#      the check of the last timed call against the reference catches it.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))
        self.calls = 0
        self.last = None

    def forward(self, x):
        self.calls += 1
        if self.calls > 5 and self.last is not None:
            return self.last
        self.last = x @ self.weight
        return self.last
