# level: 2
# tags: norm, layernorm, elementwise, fusion, fp32, memory-bound
"""LayerNorm(x) * gamma_scale + residual: three memory-bound passes that fuse into one."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
TOKENS, HIDDEN = (512, 512) if SMALL else (16384, 4096)


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden, elementwise_affine=False)
        self.scale = nn.Parameter(torch.rand(hidden) + 0.5)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.norm(x) * self.scale + residual


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN), torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return [HIDDEN]
