# level: 2
# tags: matmul, linear, activation, fusion, bf16, compute-bound
"""bf16 Linear + SiLU + scaling: a gated-MLP style GEMM with an elementwise epilogue."""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, IN_FEATURES, OUT_FEATURES = (64, 128, 256) if SMALL else (16384, 4096, 8192)


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int, scale: float):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=False).to(torch.bfloat16)
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.linear(x)) * self.scale


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES, dtype=torch.bfloat16)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES, 0.5]
