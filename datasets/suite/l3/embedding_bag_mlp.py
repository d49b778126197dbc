# level: 3
# tags: embedding, gather, reduction, mlp, recsys, fp32, memory-bound
"""Recommendation-model style: sum-pooled lookups in a large embedding table (EmbeddingBag) for a
bag of ids per sample, then a small MLP. Dominated by irregular gathers."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
ROWS, DIM, BATCH, BAG = (10000, 64, 64, 8) if SMALL else (1_000_000, 128, 4096, 64)


class Model(nn.Module):
    def __init__(self, rows: int, dim: int):
        super().__init__()
        self.bag = nn.EmbeddingBag(rows, dim, mode="sum")
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.bag(ids))


def get_inputs():
    return [torch.randint(0, ROWS, (BATCH, BAG))]


def get_init_inputs():
    return [ROWS, DIM]
