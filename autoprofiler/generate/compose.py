"""Compose up to five catalog ops into one KernelBench-form task, from a seed.

``generate_task(seed)`` draws a dtype, a chain length and the ops one after another (each from the ops
that apply to the tensor the previous one left), then sizes the full batch from the cost model
(``sizing.py``) and renders the source. The only randomness is ``random.Random(seed)``: the same seed,
catalog and config give the same source, byte for byte.

The source has the form of the suite's tasks (``datasets/suite``): module-level size constants chosen
at import from ``AUTOPROFILER_TASK_SIZE`` (``small`` for the CPU, ``full`` otherwise), ``class
Model(nn.Module)`` whose constructor takes the sizes it needs from ``get_init_inputs()``, parameters
and inputs in the task dtype, and ``get_inputs()``.

Example:
    >>> task = generate_task(7)
    >>> task.code.count("class Model(nn.Module)"), task.data_source == f"torch#{len(task.ops)}"
    (1, True)
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace

from autoprofiler.generate.catalog import CATALOG
from autoprofiler.generate.sizing import (
    MAX_TENSOR_ELEMS,
    StepCost,
    TaskCost,
    batch_for_memory,
    batch_for_time,
)
from autoprofiler.generate.spec import (
    DTYPES,
    ITEM_BYTES,
    LAYOUT_AXES,
    SMALL_BATCH,
    TORCH_DTYPES,
    Built,
    Op,
    TensorSpec,
)
from autoprofiler.tasks import content_hash

# Input dims of each start layout: (small choices, full choices) per non-batch axis.
INPUT_DIMS: dict[str, tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]] = {
    "mat": (((32, 64, 128, 256), (1024, 2048, 4096, 8192)),),
    "seq": (((8, 16, 32), (128, 256, 512, 1024, 2048)), ((16, 32, 64), (256, 512, 768, 1024))),
    "img1d": (((4, 8, 16), (16, 32, 64, 128)), ((16, 32, 64), (512, 1024, 2048, 4096))),
    "img2d": (
        ((3, 4, 8, 16), (3, 16, 32, 64, 128)),
        ((8, 12, 16, 24), (32, 56, 64, 112, 128)),
        ((8, 12, 16, 24), (32, 56, 64, 112, 128)),
    ),
    "img3d": (
        ((2, 4, 8), (3, 8, 16, 32)),
        ((4, 6, 8), (8, 16, 32)),
        ((6, 8, 12), (32, 48, 64)),
        ((6, 8, 12), (32, 48, 64)),
    ),
    "ids": (((8, 16, 32), (128, 256, 512, 1024, 2048)),),
}
VOCAB = ((64, 256, 1000), (32000, 50257, 128000))


class ComposeError(Exception):
    """No valid chain was found for a seed (after ``GenerateConfig.attempts`` tries)."""


@dataclass(frozen=True)
class GenerateConfig:
    """How tasks are drawn and sized.

    Attributes:
        op_count_weights: relative chance of a chain of 1, 2, ... ops (its length is the maximum).
        dtype_weights: relative chance of fp32, fp16, bf16.
        target_ms: the estimated full-size eager time is drawn log-uniformly in this range (ms).
        max_peak_gib: the estimated peak memory of one full-size forward stays under this (GiB).
        peak_gib: when set, size by memory instead: the full batch is the largest whose estimated
            peak memory stays under this many GiB (``size_class`` says ``peak<N>GiB``).
        max_small_elems: elements of any tensor at the small size (keeps the CPU check fast).
        max_small_flops: GEMM/conv flops of the whole chain at the small size.
        max_full_sample_elems: elements of any tensor per sample at full size.
        max_params: weight elements of the whole chain at full size.
        max_tensor_elems: elements of any tensor at full size (the batch stops there). The default
            keeps 32-bit indexing safe; sizing by memory past ~8 GiB per tensor needs it raised.
        attempts: chains tried per seed before ``ComposeError``.
    """

    op_count_weights: tuple[float, ...] = (1.0, 2.0, 3.0, 3.0, 3.0)
    dtype_weights: tuple[float, float, float] = (0.5, 0.25, 0.25)
    target_ms: tuple[float, float] = (2.0, 50.0)
    max_peak_gib: float = 8.0
    peak_gib: float | None = None
    max_small_elems: int = 2**18
    max_small_flops: float = 1e8
    max_full_sample_elems: int = 2**25
    max_params: int = 2**27
    max_tensor_elems: int = MAX_TENSOR_ELEMS
    attempts: int = 50

    def __post_init__(self) -> None:
        problems = []
        if not self.op_count_weights or any(w < 0 for w in self.op_count_weights):
            problems.append(f"op_count_weights must be non-negative, got {self.op_count_weights}")
        if len(self.dtype_weights) != len(DTYPES) or any(w < 0 for w in self.dtype_weights):
            problems.append(
                f"dtype_weights must be 3 non-negative weights (fp32, fp16, bf16), got {self.dtype_weights}"
            )
        low, high = self.target_ms
        if not 0 < low <= high:
            problems.append(f"target_ms must be 0 < low <= high, got {self.target_ms}")
        if self.peak_gib is not None and self.peak_gib <= 0:
            problems.append(f"peak_gib must be > 0, got {self.peak_gib}")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class GeneratedTask:
    """One generated task and what the generator knows about it.

    ``small_shape``/``full_shape`` are the output shapes the chain predicts (the CPU check compares
    them with what the code gives); ``est_full_ms``/``est_full_peak_gib`` come from the cost model.
    """

    seed: int
    code: str
    hash: str
    ops: tuple[str, ...]
    apis: tuple[str, ...]
    families: tuple[str, ...]
    dtype: str
    input_layout: str
    small_shape: tuple[int, ...]
    full_shape: tuple[int, ...]
    output_dtype: str
    full_batch: int
    est_full_ms: float
    est_full_peak_gib: float
    size_class: str

    @property
    def data_source(self) -> str:
        """``torch#k``: Ops-6K's name for a task composed of k torch operators."""
        return f"torch#{len(self.ops)}"


@dataclass
class _Extra:
    arg: str
    spec: TensorSpec
    high: str | None


@dataclass
class Chain:
    """The chain being built; implements ``spec.BuildContext`` for the ops' ``build`` functions."""

    rng: random.Random
    dtype: str
    config: GenerateConfig
    index: int = 0
    constants: dict[str, tuple[int, int]] = field(default_factory=dict)
    init_args: list[str] = field(default_factory=list)
    extras: list[_Extra] = field(default_factory=list)
    built: list[tuple[Op, Built, TensorSpec, int]] = field(default_factory=list)  # op, built, input, extras

    # -- BuildContext --------------------------------------------------------------------------------
    def arg(self, spec: TensorSpec, axis: int) -> str:
        name = spec.names[axis]
        if name is None:
            raise ValueError(
                f"axis {axis} of a {spec.layout} tensor has no constant (the chain names every axis)"
            )
        if name not in self.init_args:
            self.init_args.append(name)
        return name.lower()

    def new_arg(self, stem: str, small: int, full: int) -> str:
        name = self._register(f"{stem}_{self.index}", small, full)
        self.init_args.append(name)
        return name.lower()

    def high_arg(self, spec: TensorSpec) -> str:
        if spec.high is None:
            raise ValueError(f"a {spec.layout} tensor has no value bound")
        if spec.high[0] not in self.init_args:
            self.init_args.append(spec.high[0])
        return spec.high[0].lower()

    def extra_input(self, spec: TensorSpec, high: str | None = None) -> str:
        spec = self._name_axes(spec)
        arg = f"{'index' if high else 'y'}{self.index}"
        self.extras.append(_Extra(arg, spec, high))
        return arg

    # -- building ------------------------------------------------------------------------------------
    def _register(self, name: str, small: int, full: int) -> str:
        base, suffix = name, 1
        while name in self.constants and self.constants[name] != (small, full):
            suffix += 1
            name = f"{base}_{suffix}"
        self.constants[name] = (small, full)
        return name

    def _name_axes(self, spec: TensorSpec) -> TensorSpec:
        """Give every unnamed axis of ``spec`` a constant ``<AXIS>_<index>``."""
        names = list(spec.names)
        for axis in range(1, spec.rank):
            if names[axis] is None:
                stem = LAYOUT_AXES[spec.layout][axis - 1]
                names[axis] = self._register(f"{stem}_{self.index}", spec.small[axis], spec.full[axis])
        return TensorSpec(spec.layout, spec.small, spec.full, tuple(names), spec.floating, spec.high)

    def add(self, op: Op, x: TensorSpec) -> TensorSpec | None:
        """Build ``op`` on ``x`` as the next step; on ``None`` or a broken size cap nothing changes."""
        saved = (dict(self.constants), list(self.init_args), list(self.extras), self.index)
        self.index += 1
        built = op.build(x, self)
        if built is not None:
            built = replace(built, out=self._name_axes(built.out))
        if built is None or not self._within_caps(built):
            self.constants, self.init_args, self.extras, self.index = saved
            return None
        self.built.append((op, built, x, len(self.extras) - len(saved[2])))
        return built.out

    def _within_caps(self, built: Built) -> bool:
        c = self.config
        tensors = [built.out] + [extra.spec for extra in self.extras]
        if any(
            t.numel("small") > c.max_small_elems or t.numel("full") > c.max_full_sample_elems for t in tensors
        ):
            return False
        flops_small = built.flops[0] + sum(b.flops[0] for _, b, _, _ in self.built)
        params = built.params + sum(b.params for _, b, _, _ in self.built)
        return flops_small <= c.max_small_flops and params <= c.max_params

    def cost(self) -> TaskCost:
        item = ITEM_BYTES[self.dtype]
        steps, first_extra = [], 0
        for position, (_op, built, x, n_extras) in enumerate(self.built):
            extras = self.extras[first_extra : first_extra + n_extras]
            first_extra += n_extras
            x_bytes = x.numel("full") * (item if x.floating else ITEM_BYTES["int64"])
            out_bytes = built.out.numel("full") * (item if built.out.floating else ITEM_BYTES["int64"])
            extra_bytes = sum(e.spec.numel("full") * (item if e.spec.floating else 8) for e in extras)
            steps.append(
                StepCost(
                    flops=built.flops[1],
                    matmul=built.matmul,
                    moved=x_bytes + extra_bytes + out_bytes + 2 * built.temps * item,
                    # the task's inputs (the first op's x, every extra input) count once, in input_bytes
                    live=(x_bytes if position else 0) + out_bytes + built.temps * item,
                    param_bytes=built.params * item,
                    kernels=built.kernels,
                )
            )
        first = self.built[0][2]
        inputs = [first] + [e.spec for e in self.extras]
        input_bytes = sum(t.numel("full") * (item if t.floating else 8) for t in inputs)
        tensors = inputs + [b.out for _, b, _, _ in self.built]
        largest = max(max(t.numel("full") for t in tensors), max(b.temps for _, b, _, _ in self.built))
        return TaskCost(tuple(steps), input_bytes, largest, self.dtype != "fp32")


def _draw_input(layout: str, rng: random.Random, chain: Chain) -> TensorSpec:
    """The task's first input: dims drawn per axis at both sizes (images mostly square)."""
    axes = []
    for axis, (small_choices, full_choices) in enumerate(INPUT_DIMS[layout]):
        small, full = rng.choice(small_choices), rng.choice(full_choices)
        if layout in ("img2d", "img3d") and axis == len(INPUT_DIMS[layout]) - 1 and rng.random() < 0.7:
            small, full = axes[-1][0], axes[-1][1]  # square: width = height
        axes.append((small, full, chain._register(LAYOUT_AXES[layout][axis], small, full)))
    spec = TensorSpec("mat", (SMALL_BATCH, 1), (1, 1), ("BATCH", None)).with_axes(layout, axes)
    if layout != "ids":
        return spec
    vocab = (rng.choice(VOCAB[0]), rng.choice(VOCAB[1]))
    chain._register("VOCAB", *vocab)
    return TensorSpec(layout, spec.small, spec.full, spec.names, floating=False, high=("VOCAB", *vocab))


def _weighted_order(rng: random.Random, ops: list[Op]) -> list[Op]:
    """``ops`` in a random order where heavier ops tend to come first (weighted, without replacement)."""
    keyed = [(rng.random() ** (1.0 / op.weight), op.name, op) for op in ops if op.weight > 0]
    return [op for _, _, op in sorted(keyed, key=lambda item: (-item[0], item[1]))]


def _compose(rng: random.Random, catalog: dict[str, Op], config: GenerateConfig) -> Chain | None:
    """One attempt: a dtype, a length, a first op and its input, then the rest; None if the first fails."""
    dtype = rng.choices(DTYPES, weights=config.dtype_weights)[0]
    length = rng.choices(range(1, len(config.op_count_weights) + 1), weights=config.op_count_weights)[0]
    chain = Chain(rng=rng, dtype=dtype, config=config)
    starters = [op for op in catalog.values() if any(layout in INPUT_DIMS for layout in op.layouts)]
    first = _weighted_order(rng, starters)[0]
    layout = rng.choice([layout for layout in first.layouts if layout in INPUT_DIMS])
    x = chain.add(first, _draw_input(layout, rng, chain))
    if x is None:
        return None
    while len(chain.built) < length:
        previous = chain.built[-1][0].name
        candidates = [
            op
            for op in catalog.values()
            if x.layout in op.layouts
            and not op.first_only
            and (x.floating or op.accepts_int)
            and op.name != previous
        ]
        for op in _weighted_order(rng, candidates)[:8]:
            out = chain.add(op, x)
            if out is not None:
                x = out
                break
        else:
            break
    return chain


def generate_task(
    seed: int, catalog: dict[str, Op] | None = None, config: GenerateConfig | None = None
) -> GeneratedTask:
    """The task for ``seed``: composed, sized and rendered.

    Args:
        seed: the only source of randomness.
        catalog: ops to draw from (default ``CATALOG``).
        config: how to draw and size (default ``GenerateConfig()``).

    Raises:
        ComposeError: no chain was found in ``config.attempts`` tries.

    Example:
        >>> generate_task(3).hash == generate_task(3).hash
        True
    """
    catalog = CATALOG if catalog is None else catalog
    config = config or GenerateConfig()
    rng = random.Random(seed)
    for _ in range(config.attempts):
        chain = _compose(rng, catalog, config)
        target_s = math.exp(rng.uniform(*(math.log(ms / 1e3) for ms in config.target_ms)))
        if chain is not None:
            break
    else:
        raise ComposeError(f"seed {seed}: no valid chain in {config.attempts} attempts")
    cost = chain.cost()
    if config.peak_gib is not None:
        batch = batch_for_memory(cost, config.peak_gib * 2**30, config.max_tensor_elems)
        size_class = f"peak{config.peak_gib:g}GiB"
    else:
        batch = batch_for_time(
            cost, target_s, config.max_peak_gib * 2**30, max_tensor_elems=config.max_tensor_elems
        )
        size_class = "time"
    chain.constants["BATCH"] = (SMALL_BATCH, batch)
    code = render(chain)
    out = chain.built[-1][1].out
    ops = tuple(op.name for op, _, _, _ in chain.built)
    apis = tuple(dict.fromkeys(api for _, built, _, _ in chain.built for api in built.apis))
    return GeneratedTask(
        seed=seed,
        code=code,
        hash=content_hash(code),
        ops=ops,
        apis=apis,
        families=tuple(dict.fromkeys(op.family for op, _, _, _ in chain.built)),
        dtype=chain.dtype,
        input_layout=chain.built[0][2].layout,
        small_shape=out.small,
        full_shape=(batch, *out.full[1:]),
        output_dtype=chain.dtype if out.floating else "int64",
        full_batch=batch,
        est_full_ms=round(cost.seconds(batch) * 1e3, 4),
        est_full_peak_gib=round(cost.peak_bytes(batch) / 2**30, 4),
        size_class=size_class,
    )


def render(chain: Chain) -> str:
    """The KernelBench-form source of a built chain (the batch constant already set)."""
    first = chain.built[0][2]
    used = {"BATCH", *chain.init_args}
    for spec in [first] + [e.spec for e in chain.extras]:
        used.update(name for name in spec.names if name)
        used.update({spec.high[0]} if spec.high else set())
    used.update(e.high for e in chain.extras if e.high)
    input_names = [name for name in first.names if name]
    other = [name for name in chain.constants if name in used and name not in input_names]
    ops = [op for op, _, _, _ in chain.built]
    init = [line for _, built, _, _ in chain.built for line in built.init]
    forward = [line for _, built, _, _ in chain.built for line in built.forward]
    if chain.dtype != "fp32" and init:
        init.append("self.to(DTYPE)")
    body = "\n".join(init + forward)
    families = list(dict.fromkeys(op.family for op in ops))
    lines = [
        f"# level: {1 if len(ops) == 1 else 2}",
        f"# tags: {', '.join(families + [chain.dtype])}",
        f'"""Generated task ({chain.dtype}): {" -> ".join(op.name for op in ops)}."""',
        "",
        *(["import math"] if "math." in body else []),
        "import os",
        "",
        "import torch",
        "import torch.nn as nn",
        "import torch.nn.functional as F",
        "",
        'SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"',
        f"DTYPE = {TORCH_DTYPES[chain.dtype]}",
        _constants_line(input_names, chain.constants),
        *(_constants_line([name], chain.constants) for name in other),
        "",
        "",
        "class Model(nn.Module):",
        f"    def __init__(self{''.join(', ' + name.lower() for name in chain.init_args)}):",
        "        super().__init__()",
        *(f"        {line}" for line in init),
        "",
        f"    def forward(self, x{''.join(', ' + e.arg for e in chain.extras)}):",
        *(f"        {line}" for line in forward),
        "        return x",
        "",
        "",
        "def get_inputs():",
        f"    x = {_input_expression(first, None)}",
        *(f"    {e.arg} = {_input_expression(e.spec, e.high)}" for e in chain.extras),
        f"    return [x{''.join(', ' + e.arg for e in chain.extras)}]",
        "",
        "",
        "def get_init_inputs():",
        f"    return [{', '.join(chain.init_args)}]",
        "",
    ]
    return "\n".join(lines)


def _constants_line(names: list[str], constants: dict[str, tuple[int, int]]) -> str:
    if len(names) == 1:
        small, full = constants[names[0]]
        return f"{names[0]} = {small} if SMALL else {full}"
    small = ", ".join(str(constants[name][0]) for name in names)
    full = ", ".join(str(constants[name][1]) for name in names)
    return f"{', '.join(names)} = ({small}) if SMALL else ({full})"


def _input_expression(spec: TensorSpec, high: str | None) -> str:
    shape = ", ".join(name for name in spec.names if name)
    if spec.high is not None:
        return f"torch.randint(0, {spec.high[0]}, ({shape},))"
    if high is not None:
        return f"torch.randint(0, {high}, ({shape},))"
    return f"torch.randn({shape}, dtype=DTYPE)"
