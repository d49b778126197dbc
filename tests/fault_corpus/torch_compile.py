# expect: correct
# task: matmul
# message: -
# why: a torch.compile candidate: importing torch._dynamo wraps torch.manual_seed (torch's own
#      functools.wraps wrapper), which must not be mistaken for monkeypatching.
import torch
import torch._dynamo  # noqa: F401  (what torch.compile imports; the compile itself is not needed here)
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        return x @ self.weight
