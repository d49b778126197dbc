"""Catalog entries with GEMM/conv work: matmul and linear, convolutions, attention, embeddings.

Each ``_build_*`` takes the current tensor and a ``BuildContext`` and returns a ``Built`` or ``None``
(the op does not apply at one of the two sizes). Sizes an op introduces are drawn as a (small, full)
pair; weights stay under ``MAX_PARAMS`` elements at full size.
"""

from __future__ import annotations

from autoprofiler.generate.spec import SMALL_BATCH, BuildContext, Built, Op, TensorSpec

MAX_PARAMS = 2**26  # weight elements of one op at full size (256 MiB in fp32)
SMALL_FEATURES = (16, 32, 64, 128)
FULL_FEATURES = (256, 512, 1024, 2048, 4096)
SMALL_CHANNELS = (4, 8, 16)
FULL_CHANNELS = (16, 32, 64, 128, 256)
HEADS = (1, 2, 4, 8, 16)


def _rows(x: TensorSpec) -> tuple[int, int]:
    """Rows a last-axis GEMM sees: (small total, full per sample)."""
    return x.numel("small") // x.small[-1], x.numel("full") // x.full[-1]


def _features(ctx: BuildContext, stem: str) -> tuple[str, int, int]:
    small, full = ctx.rng.choice(SMALL_FEATURES), ctx.rng.choice(FULL_FEATURES)
    return ctx.new_arg(stem, small, full), small, full


def _last_axis_gemm(x: TensorSpec, ctx: BuildContext, stem: str):
    """Shared part of linear/matmul/einsum/addmm: the input and output feature arguments, the output,
    its flops and weight elements; None past the weight cap."""
    f_small, f_full = x.small[-1], x.full[-1]
    fin = ctx.arg(x, x.rank - 1)
    name, g_small, g_full = _features(ctx, stem)
    if f_full * g_full > MAX_PARAMS:
        return None
    rows_small, rows_full = _rows(x)
    out = x.replace_axis(x.rank - 1, g_small, g_full, name.upper())
    flops = (2.0 * rows_small * f_small * g_small, 2.0 * rows_full * f_full * g_full)
    return fin, name, out, flops, f_full * g_full


def _last_axis_gemm_op(api: str, init: tuple[str, ...], forward: str):
    """A builder of one GEMM over the last axis (linear, matmul, einsum, addmm): ``init`` and
    ``forward`` are templates over ``{i}`` (the op's index), ``{fin}`` and ``{name}`` (the in and out
    feature sizes)."""

    def build(x: TensorSpec, ctx: BuildContext) -> Built | None:
        shared = _last_axis_gemm(x, ctx, "OUT_FEATURES")
        if shared is None:
            return None
        fin, name, out, flops, params = shared
        fields = {"i": ctx.index, "fin": fin, "name": name}
        return Built(
            apis=(api,),
            out=out,
            init=tuple(line.format(**fields) for line in init),
            forward=(forward.format(**fields),),
            flops=flops,
            matmul=True,
            params=params,
        )

    return build


_WEIGHT = "self.weight{i} = nn.Parameter(torch.randn({fin}, {name}) / math.sqrt({fin}))"
_build_linear = _last_axis_gemm_op(
    "torch.nn.Linear", ("self.linear{i} = nn.Linear({fin}, {name})",), "x = self.linear{i}(x)"
)
_build_matmul = _last_axis_gemm_op("torch.matmul", (_WEIGHT,), "x = torch.matmul(x, self.weight{i})")
_build_einsum = _last_axis_gemm_op(
    "torch.einsum", (_WEIGHT,), 'x = torch.einsum("nlf,fg->nlg", x, self.weight{i})'
)
_build_addmm = _last_axis_gemm_op(
    "torch.addmm",
    (_WEIGHT, "self.bias{i} = nn.Parameter(torch.randn({name}))"),
    "x = torch.addmm(self.bias{i}, x, self.weight{i})",
)


def _build_bmm_gram(x: TensorSpec, ctx: BuildContext) -> Built | None:
    """(N, L, F) -> (N, L, L): the per-sample Gram matrix, scaled to keep values near unit size."""
    (_, l_small, f_small), (_, l_full, f_full) = x.small, x.full
    if l_full > 4096:
        return None
    out = x.with_axes("seq", [(l_small, l_full, x.names[1]), (l_small, l_full, x.names[1])])
    return Built(
        apis=("torch.bmm",),
        out=out,
        forward=("x = torch.bmm(x, x.transpose(1, 2)) / math.sqrt(x.shape[-1])",),
        flops=(2.0 * SMALL_BATCH * l_small * l_small * f_small, 2.0 * l_full * l_full * f_full),
        matmul=True,
        kernels=2,
    )


def _build_bmm_input(x: TensorSpec, ctx: BuildContext) -> Built | None:
    """(N, L, F) @ (N, F, G) with the second operand a further input."""
    (_, l_small, f_small), (_, l_full, f_full) = x.small, x.full
    g_small, g_full = ctx.rng.choice(SMALL_FEATURES), ctx.rng.choice(FULL_FEATURES)
    if f_full * g_full > MAX_PARAMS:
        return None
    other = x.with_axes("seq", [(f_small, f_full, x.names[2]), (g_small, g_full, None)])
    y = ctx.extra_input(other)
    out = x.replace_axis(2, g_small, g_full, None)
    return Built(
        apis=("torch.bmm",),
        out=out,
        forward=(f"x = torch.bmm(x, {y})",),
        flops=(2.0 * SMALL_BATCH * l_small * f_small * g_small, 2.0 * l_full * f_full * g_full),
        matmul=True,
    )


def _conv_out(length: int, kernel: int, stride: int, padding: int, transposed: bool) -> int:
    if transposed:
        return (length - 1) * stride - 2 * padding + kernel
    return (length + 2 * padding - kernel) // stride + 1


def _conv_builder(dims: int, transposed: bool, depthwise: bool = False):
    cls = f"nn.Conv{'Transpose' if transposed else ''}{dims}d"
    attr = "deconv" if transposed else ("dwconv" if depthwise else "conv")

    def build(x: TensorSpec, ctx: BuildContext) -> Built | None:
        rng, i = ctx.rng, ctx.index
        c_small, c_full = x.small[1], x.full[1]
        if transposed:
            kernel, stride = rng.choice(((2, 2), (3, 2), (4, 2), (3, 1)))
            padding = rng.choice((0, 1)) if kernel >= 3 else 0
        elif depthwise:
            kernel, stride = rng.choice((3, 5, 7)), rng.choice((1, 1, 2))
            padding = kernel // 2
        else:
            kernel = rng.choice((1, 3, 3, 5) if dims < 3 else (1, 3, 3))
            stride = rng.choice((1, 1, 2))
            padding = kernel // 2
        if dims == 2 and not transposed and not depthwise and rng.random() < 0.1:
            kernel, stride, padding = 7, 2, 3  # a ResNet-style stem
        spatial = []
        for small, full, name in x.axes()[1:]:
            out_small = _conv_out(small, kernel, stride, padding, transposed)
            out_full = _conv_out(full, kernel, stride, padding, transposed)
            if out_small < 1 or out_full < 1 or small + 2 * padding < kernel:
                return None
            same = (out_small, out_full) == (small, full)
            spatial.append((out_small, out_full, name if same else None))
        cin = ctx.arg(x, 1)
        if depthwise:
            cout, o_small, o_full, groups = cin, c_small, c_full, f", groups={cin}"
        else:
            o_small, o_full = rng.choice(SMALL_CHANNELS), rng.choice(FULL_CHANNELS)
            cout, groups = ctx.new_arg("OUT_CHANNELS", o_small, o_full), ""
        per_out = kernel**dims * (1 if depthwise else c_full)
        params = o_full * per_out
        if params > MAX_PARAMS:
            return None
        out = x.with_axes(
            x.layout, [(o_small, o_full, cout.upper() if not depthwise else x.names[1])] + spatial
        )
        if transposed:  # each input element scatters kernel**dims * C_out products
            flops = (
                2.0 * x.numel("small") * o_small * kernel**dims,
                2.0 * x.numel("full") * o_full * kernel**dims,
            )
        else:
            per_out_small = kernel**dims * (1 if depthwise else c_small)
            flops = (2.0 * out.numel("small") * per_out_small, 2.0 * out.numel("full") * per_out)
        return Built(
            apis=(f"torch.{cls}",),
            out=out,
            init=(
                f"self.{attr}{i} = {cls}({cin}, {cout}, kernel_size={kernel}, stride={stride}, "
                f"padding={padding}{groups})",
            ),
            forward=(f"x = self.{attr}{i}(x)",),
            flops=flops,
            matmul=True,
            params=params,
        )

    return build


def _heads(x: TensorSpec, ctx: BuildContext) -> int | None:
    """A head count dividing the features at both sizes (head dim >= 4 small, <= 256 full)."""
    f_small, f_full = x.small[2], x.full[2]
    options = [h for h in HEADS if f_small % h == 0 and f_full % h == 0 and f_small // h >= 4]
    options = [h for h in options if f_full // h <= 256]
    return ctx.rng.choice(options) if options else None


def _build_sdpa(x: TensorSpec, ctx: BuildContext) -> Built | None:
    """Self-attention of the features split into heads, q = k = v = x."""
    heads = _heads(x, ctx)
    if heads is None or x.full[1] > 8192:
        return None
    causal = ctx.rng.random() < 0.5
    (_, l_small, f_small), (_, l_full, f_full) = x.small, x.full
    return Built(
        apis=("torch.nn.functional.scaled_dot_product_attention",),
        out=x,
        forward=(
            "n, l, f = x.shape",
            f"q = x.view(n, l, {heads}, f // {heads}).transpose(1, 2)",
            f"x = F.scaled_dot_product_attention(q, q, q, is_causal={causal})",
            "x = x.transpose(1, 2).reshape(n, l, f)",
        ),
        flops=(4.0 * SMALL_BATCH * l_small * l_small * f_small, 4.0 * l_full * l_full * f_full),
        matmul=True,
        temps=l_full * f_full,
        kernels=2,
    )


def _build_self_attention(x: TensorSpec, ctx: BuildContext) -> Built | None:
    """QKV projection, multi-head scaled-dot-product attention, output projection."""
    heads = _heads(x, ctx)
    if heads is None or x.full[1] > 8192 or 4 * x.full[2] ** 2 > MAX_PARAMS:
        return None
    causal = ctx.rng.random() < 0.5
    i, f = ctx.index, ctx.arg(x, 2)
    (_, l_small, f_small), (_, l_full, f_full) = x.small, x.full
    flops_small = SMALL_BATCH * (8.0 * l_small * f_small**2 + 4.0 * l_small**2 * f_small)
    return Built(
        apis=("torch.nn.Linear", "torch.nn.functional.scaled_dot_product_attention"),
        out=x,
        init=(f"self.qkv{i} = nn.Linear({f}, 3 * {f})", f"self.proj{i} = nn.Linear({f}, {f})"),
        forward=(
            "n, l, f = x.shape",
            f"q, k, v = self.qkv{i}(x).view(n, l, 3, {heads}, f // {heads}).permute(2, 0, 3, 1, 4)",
            f"x = F.scaled_dot_product_attention(q, k, v, is_causal={causal})",
            f"x = self.proj{i}(x.transpose(1, 2).reshape(n, l, f))",
        ),
        flops=(flops_small, 8.0 * l_full * f_full**2 + 4.0 * l_full**2 * f_full),
        matmul=True,
        params=4 * f_full**2,
        temps=5 * l_full * f_full,
        kernels=5,
    )


def _build_attention_explicit(x: TensorSpec, ctx: BuildContext) -> Built | None:
    """softmax(x x^T / sqrt(F)) x, written out: the L x L scores reach memory."""
    (_, l_small, f_small), (_, l_full, f_full) = x.small, x.full
    if l_full > 4096:
        return None
    return Built(
        apis=("torch.matmul", "torch.softmax"),
        out=x,
        forward=(
            "scores = torch.matmul(x, x.transpose(1, 2)) / math.sqrt(x.shape[-1])",
            "x = torch.matmul(torch.softmax(scores, dim=-1), x)",
        ),
        flops=(4.0 * SMALL_BATCH * l_small**2 * f_small, 4.0 * l_full**2 * f_full),
        matmul=True,
        temps=2 * l_full**2,
        kernels=4,
    )


def _embedding_dim(x: TensorSpec, ctx: BuildContext) -> tuple[str, str, int, int] | None:
    """Vocabulary and embedding width, or None when the table would pass ``MAX_PARAMS`` at full size."""
    d_small, d_full = ctx.rng.choice((16, 32, 64)), ctx.rng.choice((256, 512, 1024, 2048))
    if x.high is None or x.high[2] * d_full > 2 * MAX_PARAMS:
        return None
    return ctx.high_arg(x), ctx.new_arg("EMBED_DIM", d_small, d_full), d_small, d_full


def _build_embedding(x: TensorSpec, ctx: BuildContext) -> Built | None:
    drawn = _embedding_dim(x, ctx)
    if drawn is None:
        return None
    vocab, dim, d_small, d_full = drawn
    (_, l_small), (_, l_full) = x.small, x.full
    out = x.with_axes("seq", [(l_small, l_full, x.names[1]), (d_small, d_full, dim.upper())])
    return Built(
        apis=("torch.nn.Embedding",),
        out=out,
        init=(f"self.embedding{ctx.index} = nn.Embedding({vocab}, {dim})",),
        forward=(f"x = self.embedding{ctx.index}(x)",),
        params=x.high[2] * d_full,
    )


def _build_embedding_bag(x: TensorSpec, ctx: BuildContext) -> Built | None:
    drawn = _embedding_dim(x, ctx)
    if drawn is None:
        return None
    vocab, dim, d_small, d_full = drawn
    mode = ctx.rng.choice(("mean", "sum", "max"))
    out = x.with_axes("mat", [(d_small, d_full, dim.upper())])
    return Built(
        apis=("torch.nn.EmbeddingBag",),
        out=out,
        init=(f'self.bag{ctx.index} = nn.EmbeddingBag({vocab}, {dim}, mode="{mode}")',),
        forward=(f"x = self.bag{ctx.index}(x)",),
        params=x.high[2] * d_full,
        temps=x.full[1] * d_full,  # the gathered rows, read once
    )


OPS = (
    Op("linear", "matmul", ("mat", "seq"), _build_linear, weight=2.0),
    Op("matmul", "matmul", ("mat", "seq"), _build_matmul),
    Op("addmm", "matmul", ("mat",), _build_addmm),
    Op("einsum", "matmul", ("seq",), _build_einsum),
    Op("bmm_gram", "matmul", ("seq",), _build_bmm_gram),
    Op("bmm_input", "matmul", ("seq",), _build_bmm_input),
    Op("conv1d", "conv", ("img1d",), _conv_builder(1, False), weight=1.5),
    Op("conv2d", "conv", ("img2d",), _conv_builder(2, False), weight=2.0),
    Op("conv3d", "conv", ("img3d",), _conv_builder(3, False), weight=1.5),
    Op("conv_transpose1d", "conv", ("img1d",), _conv_builder(1, True)),
    Op("conv_transpose2d", "conv", ("img2d",), _conv_builder(2, True)),
    Op("conv_transpose3d", "conv", ("img3d",), _conv_builder(3, True)),
    Op("depthwise_conv2d", "conv", ("img2d",), _conv_builder(2, False, depthwise=True)),
    Op("sdpa", "attention", ("seq",), _build_sdpa),
    Op("self_attention", "attention", ("seq",), _build_self_attention),
    Op("attention_explicit", "attention", ("seq",), _build_attention_explicit),
    Op("embedding", "embedding", ("ids",), _build_embedding, first_only=True, accepts_int=True, weight=1.5),
    Op("embedding_bag", "embedding", ("ids",), _build_embedding_bag, first_only=True, accepts_int=True),
)
