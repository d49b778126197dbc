# level: 3
# tags: rnn, gru, recurrent, loop, algorithmic, fp32, latency-bound
"""A GRU cell stepped in a Python loop over time: per step two small GEMMs and a handful of
elementwise ops. Launch-bound; batching the input projection over all steps (or nn.GRU) helps."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, SEQ, INPUT, HIDDEN = (2, 8, 16, 32) if SMALL else (32, 128, 256, 512)


class Model(nn.Module):
    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.cell = nn.GRUCell(input_size, hidden_size)
        self.hidden_size = hidden_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(x.shape[0], self.hidden_size, device=x.device, dtype=x.dtype)
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
        return h


def get_inputs():
    return [torch.randn(BATCH, SEQ, INPUT)]


def get_init_inputs():
    return [INPUT, HIDDEN]
