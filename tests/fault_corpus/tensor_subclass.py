# expect: wrong_output
# task: matmul
# message: not allclose
# why: returns zeros wrapped in a tensor subclass whose __torch_function__ answers True to allclose and
#      equal: the harness compares with torch-function overrides disabled.
import torch
import torch.nn as nn


class _Agreeable(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.allclose, torch.equal):
            return True
        return super().__torch_function__(func, types, args, kwargs or {})


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        return torch.zeros(x.shape[0], self.weight.shape[1], device=x.device).as_subclass(_Agreeable)
