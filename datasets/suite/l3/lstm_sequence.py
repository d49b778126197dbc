# level: 3
# tags: rnn, lstm, recurrent, matmul, fp32, latency-bound
"""Two-layer LSTM over a sequence, returning the last layer's outputs: a sequential dependency
over time steps of small GEMMs."""

import os

import torch
import torch.nn as nn

SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"
BATCH, SEQ, INPUT, HIDDEN = (2, 8, 32, 32) if SMALL else (64, 256, 512, 512)


class Model(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, layers: int):
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers=layers, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output, _ = self.lstm(x)
        return output


def get_inputs():
    return [torch.randn(BATCH, SEQ, INPUT)]


def get_init_inputs():
    return [INPUT, HIDDEN, 2]
