"""Catalog entries that change the shape or read along an axis: reductions, softmax and logsumexp,
pooling, scans, indexing and layout changes.

None of them runs over the batch axis (dim 0): every sample stays independent, so costs stay linear in
the batch (see ``spec.py``).
"""

from __future__ import annotations

from autoprofiler.generate.spec import ITEM_BYTES, SPATIAL_LAYOUTS, BuildContext, Built, Op, TensorSpec

FEATURE_LAYOUTS = ("mat", "seq")
AXIS_LAYOUTS = ("mat", "seq", "img1d", "img2d", "img3d")  # layouts with at least one non-batch axis


def _index_temps(out: TensorSpec, ctx: BuildContext) -> int:
    """The int64 indices an op allocates beside its values (cummax, sort, topk, max pooling), counted
    in elements of the task dtype for ``Built.temps``."""
    return out.numel("full") * ITEM_BYTES["int64"] // ITEM_BYTES[ctx.dtype]


def _reductions(x: TensorSpec) -> list[tuple[str, TensorSpec, int]]:
    """Ways to reduce ``x``: (the ``dim`` argument, the output, elements reduced at the small size)."""
    a = x.axes()
    if x.layout == "mat":
        return [("1", x.with_axes("vec", []), a[0][0])]
    if x.layout == "seq":
        return [("1", x.with_axes("mat", [a[1]]), a[0][0]), ("2", x.with_axes("mat", [a[0]]), a[1][0])]
    if x.layout == "img1d":
        return [("2", x.with_axes("mat", [a[0]]), a[1][0])]
    if x.layout == "img2d":
        return [
            ("(2, 3)", x.with_axes("mat", [a[0]]), a[1][0] * a[2][0]),
            ("3", x.with_axes("img1d", [a[0], a[1]]), a[2][0]),
        ]
    if x.layout == "img3d":
        return [
            ("(2, 3, 4)", x.with_axes("mat", [a[0]]), a[1][0] * a[2][0] * a[3][0]),
            ("2", x.with_axes("img2d", [a[0], a[2], a[3]]), a[1][0]),
        ]
    return []


def _reduction(call: str, api: str, single_dim: bool = False, needs_two: bool = False, integer: bool = False):
    """``x = <call>(x, dim=D)`` over a drawn axis (or axes); ``single_dim`` for calls taking one int."""

    def build(x: TensorSpec, ctx: BuildContext) -> Built | None:
        options = [
            (dim, out, count)
            for dim, out, count in _reductions(x)
            if not (single_dim and dim.startswith("(")) and not (needs_two and count < 2)
        ]
        if not options:
            return None
        dim, out, _ = ctx.rng.choice(options)
        return Built(
            apis=(api,), out=out.as_int() if integer else out, forward=(f"x = {call}(x, dim={dim})",)
        )

    return build


def _build_softmax(call: str, api: str):
    def build(x: TensorSpec, ctx: BuildContext) -> Built | None:
        if x.layout in SPATIAL_LAYOUTS:
            dim = "1"
        elif x.layout == "seq" and ctx.rng.random() < 0.3:
            dim = "1"
        else:
            dim = "-1"
        return Built(apis=(api,), out=x, forward=(f"x = {call}(x, dim={dim})",), kernels=1)

    return build


def _build_pool(kind: str):
    def build(x: TensorSpec, ctx: BuildContext) -> Built | None:
        dims = x.rank - 2
        if kind == "avg" and dims == 3 and ctx.dtype != "fp32":
            return None  # avg_pool3d has no CPU kernel for fp16/bf16: the CPU check could not run it
        kernel = ctx.rng.choice((2, 3))
        stride = ctx.rng.choice((kernel, 2, 1))
        padding = ctx.rng.choice((0, 1)) if kernel == 3 else 0
        spatial = []
        for small, full, _name in x.axes()[1:]:
            if small + 2 * padding < kernel:
                return None
            spatial.append(
                ((small + 2 * padding - kernel) // stride + 1, (full + 2 * padding - kernel) // stride + 1)
            )
        out = x.with_axes(x.layout, [x.axes()[0]] + [(s, f, None) for s, f in spatial])
        return Built(
            apis=(f"torch.nn.functional.{kind}_pool{dims}d",),
            out=out,
            forward=(
                f"x = F.{kind}_pool{dims}d(x, kernel_size={kernel}, stride={stride}, padding={padding})",
            ),
            temps=_index_temps(out, ctx) if kind == "max" else 0,  # CUDA's max pooling keeps indices
        )

    return build


def _build_adaptive_pool(kind: str):
    def build(x: TensorSpec, ctx: BuildContext) -> Built | None:
        dims = x.rank - 2
        smallest = min(x.small[2:])
        options = [o for o in (1, 2, 4, 7) if o <= smallest]
        if not options:
            return None
        size = ctx.rng.choice(options)
        out = x.with_axes(x.layout, [x.axes()[0]] + [(size, size, None)] * dims)
        return Built(
            apis=(f"torch.nn.functional.adaptive_{kind}_pool{dims}d",),
            out=out,
            forward=(f"x = F.adaptive_{kind}_pool{dims}d(x, {size})",),
            temps=_index_temps(out, ctx) if kind == "max" else 0,
        )

    return build


def _scan(call: str, api: str, suffix: str = "", indices: bool = False):
    def build(x: TensorSpec, ctx: BuildContext) -> Built | None:
        if x.layout == "vec":
            return None
        dim = ctx.rng.choice(range(1, x.rank)) if x.layout != "mat" else 1
        if x.layout in SPATIAL_LAYOUTS and dim == 1 and ctx.rng.random() < 0.7:
            dim = x.rank - 1  # along space more often than along channels
        temps = _index_temps(x, ctx) if indices else 0
        return Built(apis=(api,), out=x, forward=(f"x = {call}(x, dim={dim}){suffix}",), temps=temps)

    return build


def _build_gather(x: TensorSpec, ctx: BuildContext) -> Built | None:
    """Pick K entries of the last axis per row through an index tensor given as an input."""
    k_small = [k for k in (4, 8, 16, 32) if k <= x.small[-1]]
    k_full = [k for k in (64, 128, 256, 512) if k <= x.full[-1]]
    if not (k_small and k_full):
        return None
    index_spec = x.replace_axis(x.rank - 1, ctx.rng.choice(k_small), ctx.rng.choice(k_full), None).as_int()
    index = ctx.extra_input(index_spec, high=x.names[-1])
    out = TensorSpec(index_spec.layout, index_spec.small, index_spec.full, index_spec.names)
    return Built(apis=("torch.gather",), out=out, forward=(f"x = torch.gather(x, -1, {index})",))


def _build_index_select(x: TensorSpec, ctx: BuildContext) -> Built | None:
    """Keep a fixed random subset of the channels (images) or features, in a random order."""
    axis = 1 if x.layout in SPATIAL_LAYOUTS else x.rank - 1
    divisor = ctx.rng.choice((2, 4))
    keep_small, keep_full = x.small[axis] // divisor, x.full[axis] // divisor
    if keep_small < 1 or keep_full < 1:
        return None
    i, n = ctx.index, ctx.arg(x, axis)
    keep = ctx.new_arg("KEEP", keep_small, keep_full)
    return Built(
        apis=("torch.index_select", "torch.randperm"),
        out=x.replace_axis(axis, keep_small, keep_full, keep.upper()),
        init=(f'self.register_buffer("index{i}", torch.randperm({n})[:{keep}])',),
        forward=(f"x = torch.index_select(x, {axis if axis == 1 else -1}, self.index{i})",),
    )


def _build_masked_fill(x: TensorSpec, ctx: BuildContext) -> Built | None:
    threshold = ctx.rng.choice((-1.0, 0.0, 0.5))
    return Built(
        apis=("torch.Tensor.masked_fill",),
        out=x,
        forward=(f"x = x.masked_fill(x < {threshold}, 0.0)",),
        kernels=2,
    )


def _build_topk(x: TensorSpec, ctx: BuildContext) -> Built | None:
    k_small = [k for k in (2, 4, 8) if k <= x.small[-1] // 2]
    k_full = [k for k in (8, 16, 32, 64) if k <= x.full[-1] // 2]
    if not (k_small and k_full):
        return None
    i, small, full = ctx.index, ctx.rng.choice(k_small), ctx.rng.choice(k_full)
    k = ctx.new_arg("TOP_K", small, full)
    out = x.replace_axis(x.rank - 1, small, full, k.upper())
    return Built(
        apis=("torch.topk",),
        out=out,
        init=(f"self.k{i} = {k}",),
        forward=(f"x = torch.topk(x, self.k{i}, dim=-1).values",),
        temps=_index_temps(out, ctx),
    )


def _build_sort(x: TensorSpec, ctx: BuildContext) -> Built | None:
    descending = ctx.rng.random() < 0.5
    return Built(
        apis=("torch.sort",),
        out=x,
        forward=(f"x = torch.sort(x, dim=-1, descending={descending}).values",),
        temps=_index_temps(x, ctx),
    )


def _build_flip(x: TensorSpec, ctx: BuildContext) -> Built | None:
    dim = ctx.rng.choice(range(1, x.rank))
    return Built(apis=("torch.flip",), out=x, forward=(f"x = torch.flip(x, dims=[{dim}])",))


def _build_roll(x: TensorSpec, ctx: BuildContext) -> Built | None:
    dim, shift = ctx.rng.choice(range(1, x.rank)), ctx.rng.choice((1, 2, 3, -1))
    return Built(apis=("torch.roll",), out=x, forward=(f"x = torch.roll(x, shifts={shift}, dims={dim})",))


def _build_flatten(x: TensorSpec, ctx: BuildContext) -> Built | None:
    out = x.with_axes("mat", [(x.numel("small") // x.small[0], x.numel("full"), None)])
    return Built(apis=("torch.flatten",), out=out, forward=("x = torch.flatten(x, 1)",), kernels=0)


def _build_transpose(x: TensorSpec, ctx: BuildContext) -> Built | None:
    """(N, L, F) <-> (N, C, L): tokens to channels and back; sometimes made contiguous (a copy)."""
    first, second = x.axes()
    out = x.with_axes("img1d" if x.layout == "seq" else "seq", [second, first])
    contiguous = ctx.rng.random() < 0.5
    return Built(
        apis=("torch.transpose",) + (("torch.Tensor.contiguous",) if contiguous else ()),
        out=out,
        forward=("x = x.transpose(1, 2)" + (".contiguous()" if contiguous else ""),),
        kernels=1 if contiguous else 0,
    )


def _build_tokens(x: TensorSpec, ctx: BuildContext) -> Built | None:
    """(N, C, H, W) -> (N, H*W, C): image to a token sequence, as a vision transformer does."""
    channels, (h_small, h_full, _), (w_small, w_full, _) = x.axes()
    out = x.with_axes("seq", [(h_small * w_small, h_full * w_full, None), channels])
    return Built(
        apis=("torch.flatten", "torch.transpose"),
        out=out,
        forward=("x = x.flatten(2).transpose(1, 2)",),
        kernels=0,
    )


def _build_pixel_shuffle(x: TensorSpec, ctx: BuildContext) -> Built | None:
    (c_small, c_full, _), (h_small, h_full, _), (w_small, w_full, _) = x.axes()
    if c_small % 4 or c_full % 4:
        return None
    out = x.with_axes(
        "img2d",
        [(c_small // 4, c_full // 4, None), (2 * h_small, 2 * h_full, None), (2 * w_small, 2 * w_full, None)],
    )
    return Built(apis=("torch.nn.functional.pixel_shuffle",), out=out, forward=("x = F.pixel_shuffle(x, 2)",))


def _build_pixel_unshuffle(x: TensorSpec, ctx: BuildContext) -> Built | None:
    (c_small, c_full, _), (h_small, h_full, _), (w_small, w_full, _) = x.axes()
    if any(v % 2 for v in (h_small, h_full, w_small, w_full)):
        return None
    out = x.with_axes(
        "img2d",
        [
            (4 * c_small, 4 * c_full, None),
            (h_small // 2, h_full // 2, None),
            (w_small // 2, w_full // 2, None),
        ],
    )
    return Built(
        apis=("torch.nn.functional.pixel_unshuffle",), out=out, forward=("x = F.pixel_unshuffle(x, 2)",)
    )


def _build_interpolate(x: TensorSpec, ctx: BuildContext) -> Built | None:
    dims = x.rank - 2
    smooth = {1: "linear", 2: "bilinear", 3: "trilinear"}[dims]
    mode = ctx.rng.choice(("nearest", smooth))
    corners = ", align_corners=False" if mode != "nearest" else ""
    out = x.with_axes(x.layout, [x.axes()[0]] + [(2 * s, 2 * f, None) for s, f, _ in x.axes()[1:]])
    return Built(
        apis=("torch.nn.functional.interpolate",),
        out=out,
        forward=(f'x = F.interpolate(x, scale_factor=2, mode="{mode}"{corners})',),
    )


OPS = (
    Op("sum", "reduction", AXIS_LAYOUTS, _reduction("torch.sum", "torch.sum")),
    Op("mean", "reduction", AXIS_LAYOUTS, _reduction("torch.mean", "torch.mean")),
    Op("amax", "reduction", AXIS_LAYOUTS, _reduction("torch.amax", "torch.amax")),
    Op("var", "reduction", AXIS_LAYOUTS, _reduction("torch.var", "torch.var", needs_two=True), weight=0.5),
    Op(
        "vector_norm",
        "reduction",
        AXIS_LAYOUTS,
        _reduction("torch.linalg.vector_norm", "torch.linalg.vector_norm"),
        weight=0.5,
    ),
    Op(
        "argmax",
        "reduction",
        AXIS_LAYOUTS,
        _reduction("torch.argmax", "torch.argmax", single_dim=True, integer=True),
        weight=0.5,
    ),
    Op("softmax", "softmax", AXIS_LAYOUTS, _build_softmax("torch.softmax", "torch.softmax"), weight=1.5),
    Op("log_softmax", "softmax", AXIS_LAYOUTS, _build_softmax("torch.log_softmax", "torch.log_softmax")),
    Op("logsumexp", "softmax", AXIS_LAYOUTS, _reduction("torch.logsumexp", "torch.logsumexp")),
    Op("max_pool", "pooling", SPATIAL_LAYOUTS, _build_pool("max"), weight=1.5),
    Op("avg_pool", "pooling", SPATIAL_LAYOUTS, _build_pool("avg")),
    Op("adaptive_avg_pool", "pooling", SPATIAL_LAYOUTS, _build_adaptive_pool("avg")),
    Op("adaptive_max_pool", "pooling", SPATIAL_LAYOUTS, _build_adaptive_pool("max"), weight=0.5),
    Op("cumsum", "scan", AXIS_LAYOUTS, _scan("torch.cumsum", "torch.cumsum")),
    Op("cummax", "scan", AXIS_LAYOUTS, _scan("torch.cummax", "torch.cummax", ".values", indices=True)),
    Op("logcumsumexp", "scan", AXIS_LAYOUTS, _scan("torch.logcumsumexp", "torch.logcumsumexp")),
    Op("gather", "indexing", FEATURE_LAYOUTS, _build_gather),
    Op("index_select", "indexing", AXIS_LAYOUTS, _build_index_select),
    Op("masked_fill", "indexing", AXIS_LAYOUTS, _build_masked_fill, weight=0.5),
    Op("topk", "indexing", FEATURE_LAYOUTS, _build_topk),
    Op("sort", "indexing", ("mat", "seq", "img1d"), _build_sort, weight=0.5),
    Op("flip", "indexing", AXIS_LAYOUTS, _build_flip, weight=0.5),
    Op("roll", "indexing", AXIS_LAYOUTS, _build_roll, weight=0.5),
    Op("flatten", "layout", ("seq", "img1d", "img2d", "img3d"), _build_flatten, weight=0.5),
    Op("transpose", "layout", ("seq", "img1d"), _build_transpose, weight=0.5),
    Op("tokens", "layout", ("img2d",), _build_tokens, weight=0.5),
    Op("pixel_shuffle", "layout", ("img2d",), _build_pixel_shuffle, weight=0.5),
    Op("pixel_unshuffle", "layout", ("img2d",), _build_pixel_unshuffle, weight=0.5),
    Op("interpolate", "layout", SPATIAL_LAYOUTS, _build_interpolate, weight=0.5),
)
