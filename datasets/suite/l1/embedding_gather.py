# level: 1
# tags: gather, embedding, indexing, fp32, memory-bound
"""Embedding lookup: gather rows of a large table by random token ids (irregular memory access)."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
VOCAB, DIM, BATCH, SEQ = (4096, 128, 8, 128) if SMALL else (128000, 1024, 32, 1024)


class Model(nn.Module):
    def __init__(self, vocab: int, dim: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids)


def get_inputs():
    return [torch.randint(0, VOCAB, (BATCH, SEQ))]


def get_init_inputs():
    return [VOCAB, DIM]
