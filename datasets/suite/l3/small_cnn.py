# level: 3
# tags: cnn, conv, pooling, linear, fp32, latency-bound
"""A CIFAR-sized CNN: three conv-ReLU-maxpool stages, then flatten and two linear layers. Small
images and channel counts: many short kernels."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, SIZE = (2, 32) if SMALL else (32, 32)


class Model(nn.Module):
    def __init__(self, classes: int):
        super().__init__()
        layers, channels = [], 3
        for width in (32, 64, 128):
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            channels = width
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.Flatten(), nn.Linear(128 * 4 * 4, 256), nn.ReLU(), nn.Linear(256, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def get_inputs():
    return [torch.randn(BATCH, 3, SIZE, SIZE)]


def get_init_inputs():
    return [10]
