# expect: compile_error
# task: matmul
# message: SyntaxError
# why: the source does not parse (missing closing parenthesis).
import torch


class ModelNew(torch.nn.Module):
    def forward(self, x:
        return x
