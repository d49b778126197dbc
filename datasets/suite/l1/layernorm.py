# level: 1
# tags: norm, layernorm, reduction, fp32, memory-bound
"""LayerNorm over the hidden dimension (with learned affine), transformer-activation sized."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
TOKENS, HIDDEN = (512, 512) if SMALL else (16384, 4096)


class Model(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN)]


def get_init_inputs():
    return [HIDDEN]
