# expect: wrong_output
# task: tiny_softmax
# message: relative error norm
# why: returns zeros; every softmax value is below atol=1e-4 so allclose passes; the relative-norm
#      check does not (KernelBench issue 165).
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.zeros_like(x)
