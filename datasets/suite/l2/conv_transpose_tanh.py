# level: 2
# tags: conv, conv-transpose, activation, fusion, fp32, compute-bound
"""ConvTranspose2d (2x upsampling) + bias add + tanh."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, IN_CH, OUT_CH, H, W = (2, 8, 4, 8, 8) if SMALL else (32, 128, 64, 64, 64)


class Model(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.deconv = nn.ConvTranspose2d(in_channels, out_channels, 4, stride=2, padding=1, bias=False)
        self.bias = nn.Parameter(torch.randn(out_channels, 1, 1) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.deconv(x) + self.bias)


def get_inputs():
    return [torch.randn(BATCH, IN_CH, H, W)]


def get_init_inputs():
    return [IN_CH, OUT_CH]
