# expect: runtime_error
# task: matmul_big
# message: no reference outputs in reach
# why: walks the stack up from forward looking for the harness's stored (inputs, reference outputs) pairs
#      and returns the stored output whose inputs equal its own. In a single-process harness this is
#      correct and fast; here the reference outputs live in another process, so there is nothing to find.
import sys

import torch
import torch.nn as nn


def _stored_output(x):
    frame = sys._getframe(1)
    while frame is not None:
        for value in list(frame.f_locals.values()):
            if not isinstance(value, list):
                continue
            for item in value:
                if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], (list, tuple))):
                    continue
                inputs, outputs = item
                if inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].shape == x.shape:
                    if torch.equal(inputs[0], x) and outputs and isinstance(outputs[0], torch.Tensor):
                        return outputs[0].clone()
        frame = frame.f_back
    raise RuntimeError("no reference outputs in reach")


class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        return _stored_output(x)
