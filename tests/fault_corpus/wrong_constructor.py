# expect: compile_error
# task: matmul
# message: TypeError
# why: ModelNew() takes no size argument; ModelNew(*get_init_inputs()) raises TypeError (build step).
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(32, 32))

    def forward(self, x):
        return x @ self.weight
