# level: 3
# tags: conv, depthwise, inverted-residual, mobilenet, fp16, memory-bound
"""MobileNetV2 inverted residual in fp16: 1x1 expand, ReLU6, depthwise 3x3, ReLU6, 1x1 project, add.
No BatchNorm (folded into the convolutions, as at inference)."""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, CHANNELS, SIZE = (2, 8, 16) if SMALL else (64, 32, 112)


class Model(nn.Module):
    def __init__(self, channels: int, expansion: int):
        super().__init__()
        hidden = channels * expansion
        self.expand = nn.Conv2d(channels, hidden, 1)
        self.depthwise = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.project = nn.Conv2d(hidden, channels, 1)
        self.half()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu6(self.expand(x))
        out = F.relu6(self.depthwise(out))
        return x + self.project(out)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, SIZE, SIZE, dtype=torch.float16)]


def get_init_inputs():
    return [CHANNELS, 6]
