# level: 2
# tags: matmul, linear, activation, fusion, fp32, compute-bound
"""Linear followed by GELU (the epilogue can be fused into the GEMM)."""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, IN_FEATURES, OUT_FEATURES = (128, 256, 512) if SMALL else (8192, 4096, 4096)


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.linear(x))


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
