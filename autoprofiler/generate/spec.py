"""The types an operator catalog is written in: a tensor at two sizes, an op, what building it gives.

A generated task runs at two sizes: ``small`` (the CPU check, ``AUTOPROFILER_TASK_SIZE=small``) and
``full`` (the GPU). Every tensor of a chain is tracked at both: ``TensorSpec.small`` is its concrete
shape at the small size (batch ``SMALL_BATCH``), ``TensorSpec.full`` its shape at the full size *per
sample* (batch entry 1). No op of the catalog mixes samples (reductions, scans, softmax, ... never run
over dim 0; BatchNorm's batch statistics are the one exception and stay linear in cost), so every
full-size cost is linear in the batch and the composer picks the full batch last, from the cost model
(``sizing.py``).

An ``Op`` is plain data plus one ``build(x, ctx)`` function: given the current tensor and a
``BuildContext`` it draws its hyperparameters from ``ctx.rng`` and returns a ``Built`` (code lines,
the output spec, its cost) or ``None`` when it does not apply to that tensor at one of the two sizes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

SMALL_BATCH = 2
DTYPES = ("fp32", "fp16", "bf16")
TORCH_DTYPES = {"fp32": "torch.float32", "fp16": "torch.float16", "bf16": "torch.bfloat16"}
ITEM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int64": 8}

# Non-batch axes of each layout and the stem of the constant that names an axis in generated code.
LAYOUT_AXES: dict[str, tuple[str, ...]] = {
    "vec": (),
    "mat": ("FEATURES",),
    "seq": ("SEQ_LEN", "FEATURES"),
    "img1d": ("CHANNELS", "LENGTH"),
    "img2d": ("CHANNELS", "HEIGHT", "WIDTH"),
    "img3d": ("CHANNELS", "DEPTH", "HEIGHT", "WIDTH"),
    "ids": ("SEQ_LEN",),
}
SPATIAL_LAYOUTS = ("img1d", "img2d", "img3d")


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a chain at both sizes.

    Invariants: ``len(small) == len(full) == 1 + len(LAYOUT_AXES[layout])``; ``small[0] == SMALL_BATCH``
    and ``full[0] == 1``; ``names[k]`` is the constant holding axis ``k`` (``names[0] == "BATCH"``), or
    ``None`` when no constant holds it yet (``BuildContext.const`` makes one). ``floating`` is False for
    integer tensors (token ids, argmax): only an op with ``accepts_int`` takes them. ``high`` is the
    ``(constant name, small, full)`` exclusive bound of an integer input's values (the vocabulary).
    """

    layout: str
    small: tuple[int, ...]
    full: tuple[int, ...]
    names: tuple[str | None, ...]
    floating: bool = True
    high: tuple[str, int, int] | None = None

    def __post_init__(self) -> None:
        rank = 1 + len(LAYOUT_AXES[self.layout])
        if not (len(self.small) == len(self.full) == len(self.names) == rank):
            raise ValueError(
                f"{self.layout} tensor needs rank {rank}, got small={self.small} full={self.full} "
                f"names={self.names}"
            )

    @property
    def rank(self) -> int:
        return len(self.small)

    def numel(self, size: str) -> int:
        return math.prod(self.small if size == "small" else self.full)

    def with_axes(self, layout: str, axes: list[tuple[int, int, str | None]]) -> TensorSpec:
        """A new spec of ``layout`` whose non-batch axes are ``(small, full, name)`` triples."""
        return TensorSpec(
            layout=layout,
            small=(SMALL_BATCH, *(a[0] for a in axes)),
            full=(1, *(a[1] for a in axes)),
            names=("BATCH", *(a[2] for a in axes)),
        )

    def axes(self) -> list[tuple[int, int, str | None]]:
        """The non-batch axes as ``(small, full, name)`` triples (the inverse of ``with_axes``)."""
        return list(zip(self.small[1:], self.full[1:], self.names[1:], strict=True))

    def replace_axis(self, axis: int, small: int, full: int, name: str | None = None) -> TensorSpec:
        """The same layout with non-batch axis ``axis`` (1-based, as in ``small``) resized."""
        axes = self.axes()
        axes[axis - 1] = (small, full, name)
        return self.with_axes(self.layout, axes)

    def as_int(self) -> TensorSpec:
        return TensorSpec(self.layout, self.small, self.full, self.names, floating=False)


@dataclass(frozen=True)
class Built:
    """What building one op on one tensor gives.

    Attributes:
        apis: the torch names the op uses, for the table's ``ops`` column (``"torch.nn.Conv2d"``).
        out: the output tensor.
        forward: lines of ``forward`` (no indentation); they read ``x`` and assign the result to ``x``.
        init: lines of ``__init__`` (no indentation), e.g. ``self.conv1 = nn.Conv2d(channels, ...)``.
        flops: (small total, full per sample) floating-point operations of the op's GEMM/conv part;
            0 for memory-bound ops.
        matmul: the flops run on a GEMM/conv library (tensor cores for fp16/bf16).
        params: weight elements at full size (not per sample).
        temps: per-sample elements of temporaries the op materializes at full size (attention scores).
        kernels: kernel launches the op costs in eager mode (a rough count).
    """

    apis: tuple[str, ...]
    out: TensorSpec
    forward: tuple[str, ...]
    init: tuple[str, ...] = ()
    flops: tuple[float, float] = (0.0, 0.0)
    matmul: bool = False
    params: int = 0
    temps: int = 0
    kernels: int = 1


class BuildContext(Protocol):
    """What an op's ``build`` may ask of the composer (``compose.Chain`` implements it).

    ``rng`` is the only randomness; ``index`` is the op's 1-based position (attribute and constant
    names end in it); ``dtype`` is ``"fp32"``, ``"fp16"`` or ``"bf16"``.
    """

    rng: random.Random
    index: int
    dtype: str

    def arg(self, spec: TensorSpec, axis: int) -> str:
        """The ``__init__`` parameter holding axis ``axis`` of ``spec`` (a constant is made if needed)."""
        ...

    def new_arg(self, stem: str, small: int, full: int) -> str:
        """A new size constant ``<STEM>_<index>`` passed to ``__init__``; returns its parameter name."""
        ...

    def high_arg(self, spec: TensorSpec) -> str:
        """The ``__init__`` parameter holding ``spec.high[0]`` (the vocabulary of token ids)."""
        ...

    def extra_input(self, spec: TensorSpec, high: str | None = None) -> str:
        """A further ``forward`` argument drawn in ``get_inputs`` (``torch.randn`` of the task dtype, or
        ``torch.randint(0, high, ...)`` when ``high`` names a constant); returns the argument name."""
        ...


@dataclass(frozen=True)
class Op:
    """One catalog entry.

    Attributes:
        name: the catalog key (``"conv2d"``); what coverage counts and the ``ops_key`` column holds.
        family: ``matmul``, ``conv``, ``norm``, ``activation``, ``elementwise``, ``reduction``,
            ``softmax``, ``pooling``, ``attention``, ``embedding``, ``scan``, ``indexing``, ``layout``.
        layouts: the input layouts it takes.
        build: draws hyperparameters and returns the ``Built`` code, or ``None`` when the op does not
            apply to that tensor (at either size) or that dtype.
        first_only: takes the task's input only (the embedding ops take token ids).
        accepts_int: takes an integer tensor.
        weight: relative chance of being drawn among the ops that apply.
    """

    name: str
    family: str
    layouts: tuple[str, ...]
    build: Callable[[TensorSpec, BuildContext], Built | None]
    first_only: bool = False
    accepts_int: bool = False
    weight: float = 1.0
