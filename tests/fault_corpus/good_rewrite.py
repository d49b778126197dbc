# expect: correct
# task: matmul
# why: a legitimate rewrite (torch.mm instead of @, a module-level try/except import fallback, which
#      is allowed): no false positive.
import torch
import torch.nn as nn

try:
    from torch import mm as _mm
except ImportError:
    _mm = None


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        return _mm(x, self.weight)
