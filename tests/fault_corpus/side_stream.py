# expect: gpu-not-faster
# task: matmul_cuda
# device: cuda
# why: launches the matmul on a side stream and returns without waiting: CUDA events on the current
#      stream alone would time ~0 ms. The harness synchronizes the device before reading outputs and
#      before the end event, so it is correct and not faster than the reference.
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.stream = torch.cuda.Stream()

    def forward(self, a, b):
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            out = a @ b
        return out
