# level: 2
# tags: matmul, activation, reduction, fusion, fp16, compute-bound
"""fp16 GEMM, sigmoid, then a row sum: the (batch x hidden) intermediate never needs to reach DRAM."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, IN_FEATURES, HIDDEN = (64, 128, 256) if SMALL else (16384, 2048, 4096)


class Model(nn.Module):
    def __init__(self, in_features: int, hidden: int):
        super().__init__()
        self.linear = nn.Linear(in_features, hidden).half()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.linear(x)).sum(dim=-1, keepdim=True)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES, dtype=torch.float16)]


def get_init_inputs():
    return [IN_FEATURES, HIDDEN]
