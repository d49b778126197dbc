# expect: suspicious
# task: slow_repeat
# message: suspicious_speedup=10
# why: the reference repeats the same matmul 100 times; doing it once is >10x faster, correct, and
#      flagged for review (correct=False so it is not rewarded).
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, w):
        return torch.mm(x, w)
