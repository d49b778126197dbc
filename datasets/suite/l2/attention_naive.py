# level: 2
# tags: attention, matmul, softmax, algorithmic, fp32, memory-bound
"""Scaled dot-product attention written explicitly: QK^T, scale, softmax, @V. Materializes the
(seq x seq) score matrix (2 GiB at full size), written and read by the scale and the softmax: the
passes over it outweigh the two GEMMs. A fused (flash) attention kernel never materializes it."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, HEADS, SEQ, HEAD_DIM = (2, 4, 128, 32) if SMALL else (8, 16, 2048, 64)


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        scores = torch.matmul(q, k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
        return torch.matmul(torch.softmax(scores, dim=-1), v)


def get_inputs():
    shape = (BATCH, HEADS, SEQ, HEAD_DIM)
    return [torch.randn(shape), torch.randn(shape), torch.randn(shape)]


def get_init_inputs():
    return []
