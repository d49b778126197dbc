"""Catalog entries that keep the shape: activations, elementwise arithmetic, normalizations.

All are memory-bound (``Built.flops`` stays 0); the cost model charges the bytes they move.
"""

from __future__ import annotations

from collections.abc import Callable

from autoprofiler.generate.spec import SPATIAL_LAYOUTS, BuildContext, Built, Op, TensorSpec

FLOAT_LAYOUTS = ("vec", "mat", "seq", "img1d", "img2d", "img3d")
FEATURE_LAYOUTS = ("mat", "seq")


def _unary(expression: Callable[[BuildContext], str], apis: tuple[str, ...]):
    """An elementwise op: ``x = <expression>`` with the expression's arguments drawn from ``ctx``."""

    def build(x: TensorSpec, ctx: BuildContext) -> Built | None:
        return Built(apis=apis, out=x, forward=(f"x = {expression(ctx)}",))

    return build


def _gelu(ctx: BuildContext) -> str:
    return 'F.gelu(x, approximate="tanh")' if ctx.rng.random() < 0.3 else "F.gelu(x)"


def _channel_axis(x: TensorSpec) -> int | None:
    """The axis a per-channel parameter broadcasts over: channels of an image, features otherwise."""
    if x.layout in SPATIAL_LAYOUTS:
        return 1
    if x.layout in FEATURE_LAYOUTS:
        return x.rank - 1
    return None


def _param_shape(x: TensorSpec, ctx: BuildContext) -> str | None:
    """``"c, 1, 1"`` for an image (broadcast over space), ``"f"`` for features."""
    axis = _channel_axis(x)
    if axis is None:
        return None
    return ", ".join([ctx.arg(x, axis)] + ["1"] * (x.rank - 1 - axis))


def _build_scale_shift(x: TensorSpec, ctx: BuildContext) -> Built | None:
    shape = _param_shape(x, ctx)
    if shape is None:
        return None
    i = ctx.index
    return Built(
        apis=("torch.mul", "torch.add"),
        out=x,
        init=(
            f"self.scale{i} = nn.Parameter(1.0 + 0.1 * torch.randn({shape}))",
            f"self.shift{i} = nn.Parameter(0.1 * torch.randn({shape}))",
        ),
        forward=(f"x = x * self.scale{i} + self.shift{i}",),
        params=2 * x.full[_channel_axis(x)],
        kernels=2,
    )


def _binary_with_input(symbol: str, api: str):
    def build(x: TensorSpec, ctx: BuildContext) -> Built | None:
        y = ctx.extra_input(x)
        return Built(apis=(api,), out=x, forward=(f"x = x {symbol} {y}",))

    return build


def _build_clamp(x: TensorSpec, ctx: BuildContext) -> Built | None:
    bound = ctx.rng.choice((0.5, 1.0, 2.0))
    low = ctx.rng.choice((-bound, 0.0))
    return Built(apis=("torch.clamp",), out=x, forward=(f"x = torch.clamp(x, min={low}, max={bound})",))


def _build_where(x: TensorSpec, ctx: BuildContext) -> Built | None:
    alpha = ctx.rng.choice((0.01, 0.1, 0.5))
    return Built(
        apis=("torch.where",), out=x, forward=(f"x = torch.where(x > 0, x, x * {alpha})",), kernels=2
    )


def _build_glu(x: TensorSpec, ctx: BuildContext) -> Built | None:
    """Gated linear unit: halves the last (features) or channel axis."""
    axis = _channel_axis(x)
    if axis is None or x.small[axis] % 2 or x.full[axis] % 2:
        return None
    dim = -1 if axis == x.rank - 1 else axis
    out = x.replace_axis(axis, x.small[axis] // 2, x.full[axis] // 2, None)
    return Built(apis=("torch.nn.functional.glu",), out=out, forward=(f"x = F.glu(x, dim={dim})",))


def _build_layer_norm(x: TensorSpec, ctx: BuildContext) -> Built | None:
    i, f = ctx.index, ctx.arg(x, x.rank - 1)
    return Built(
        apis=("torch.nn.LayerNorm",),
        out=x,
        init=(f"self.norm{i} = nn.LayerNorm({f})",),
        forward=(f"x = self.norm{i}(x)",),
        params=2 * x.full[-1],
    )


def _build_rms_norm(x: TensorSpec, ctx: BuildContext) -> Built | None:
    i, f = ctx.index, ctx.arg(x, x.rank - 1)
    return Built(
        apis=("torch.nn.RMSNorm",),
        out=x,
        init=(f"self.norm{i} = nn.RMSNorm({f})",),
        forward=(f"x = self.norm{i}(x)",),
        params=x.full[-1],
    )


def _build_batch_norm(x: TensorSpec, ctx: BuildContext) -> Built | None:
    """Batch statistics (the model is used as constructed, in training mode): deterministic."""
    dims = {"mat": 1, "img1d": 1, "img2d": 2, "img3d": 3}[x.layout]
    i, c = ctx.index, ctx.arg(x, 1)
    return Built(
        apis=(f"torch.nn.BatchNorm{dims}d",),
        out=x,
        init=(f"self.norm{i} = nn.BatchNorm{dims}d({c})",),
        forward=(f"x = self.norm{i}(x)",),
        params=4 * x.full[1],
        kernels=2,
    )


def _build_group_norm(x: TensorSpec, ctx: BuildContext) -> Built | None:
    c_small, c_full = x.small[1], x.full[1]
    groups = [g for g in (2, 4, 8, 16, 32) if c_small % g == 0 and c_full % g == 0]
    if not groups:
        return None
    i, c = ctx.index, ctx.arg(x, 1)
    return Built(
        apis=("torch.nn.GroupNorm",),
        out=x,
        init=(f"self.norm{i} = nn.GroupNorm({ctx.rng.choice(groups)}, {c})",),
        forward=(f"x = self.norm{i}(x)",),
        params=2 * c_full,
        kernels=2,
    )


def _build_instance_norm(x: TensorSpec, ctx: BuildContext) -> Built | None:
    dims = x.rank - 2
    if x.numel("small") // (x.small[0] * x.small[1]) < 2:  # needs more than one value per channel
        return None
    i, c = ctx.index, ctx.arg(x, 1)
    return Built(
        apis=(f"torch.nn.InstanceNorm{dims}d",),
        out=x,
        init=(f"self.norm{i} = nn.InstanceNorm{dims}d({c}, affine=True)",),
        forward=(f"x = self.norm{i}(x)",),
        params=2 * x.full[1],
        kernels=2,
    )


def _build_l2_normalize(x: TensorSpec, ctx: BuildContext) -> Built | None:
    dim = 1 if x.layout in SPATIAL_LAYOUTS else -1
    return Built(
        apis=("torch.nn.functional.normalize",), out=x, forward=(f"x = F.normalize(x, dim={dim})",), kernels=2
    )


def _activation(name: str, expression: Callable[[BuildContext], str], api: str) -> Op:
    return Op(name, "activation", FLOAT_LAYOUTS, _unary(expression, (api,)), weight=0.5)


def _choice(template: str, *values) -> Callable[[BuildContext], str]:
    return lambda ctx: template.format(ctx.rng.choice(values))


OPS = (
    _activation("relu", lambda ctx: "torch.relu(x)", "torch.relu"),
    _activation("gelu", _gelu, "torch.nn.functional.gelu"),
    _activation("silu", lambda ctx: "F.silu(x)", "torch.nn.functional.silu"),
    _activation("tanh", lambda ctx: "torch.tanh(x)", "torch.tanh"),
    _activation("sigmoid", lambda ctx: "torch.sigmoid(x)", "torch.sigmoid"),
    _activation(
        "leaky_relu",
        _choice("F.leaky_relu(x, negative_slope={})", 0.01, 0.1, 0.2),
        "torch.nn.functional.leaky_relu",
    ),
    _activation("elu", _choice("F.elu(x, alpha={})", 0.5, 1.0), "torch.nn.functional.elu"),
    _activation("selu", lambda ctx: "F.selu(x)", "torch.nn.functional.selu"),
    _activation("hardswish", lambda ctx: "F.hardswish(x)", "torch.nn.functional.hardswish"),
    _activation("softplus", _choice("F.softplus(x, beta={})", 1.0, 2.0), "torch.nn.functional.softplus"),
    _activation("mish", lambda ctx: "F.mish(x)", "torch.nn.functional.mish"),
    _activation(
        "hardtanh",
        _choice("F.hardtanh(x, min_val=-{0}, max_val={0})", 1.0, 2.0),
        "torch.nn.functional.hardtanh",
    ),
    Op("glu", "activation", FLOAT_LAYOUTS, _build_glu, weight=0.5),
    Op("scale_shift", "elementwise", FLOAT_LAYOUTS, _build_scale_shift),
    Op("residual_add", "elementwise", FLOAT_LAYOUTS, _binary_with_input("+", "torch.add")),
    Op("mul_input", "elementwise", FLOAT_LAYOUTS, _binary_with_input("*", "torch.mul"), weight=0.5),
    Op("clamp", "elementwise", FLOAT_LAYOUTS, _build_clamp, weight=0.5),
    Op(
        "square",
        "elementwise",
        FLOAT_LAYOUTS,
        _unary(lambda ctx: "torch.square(x)", ("torch.square",)),
        weight=0.5,
    ),
    Op("where", "elementwise", FLOAT_LAYOUTS, _build_where, weight=0.5),
    Op("layer_norm", "norm", FEATURE_LAYOUTS, _build_layer_norm, weight=1.5),
    Op("rms_norm", "norm", FEATURE_LAYOUTS, _build_rms_norm),
    Op("batch_norm", "norm", ("mat", "img1d", "img2d", "img3d"), _build_batch_norm, weight=1.5),
    Op("group_norm", "norm", SPATIAL_LAYOUTS, _build_group_norm),
    Op("instance_norm", "norm", SPATIAL_LAYOUTS, _build_instance_norm),
    Op("l2_normalize", "norm", ("mat", "seq", "img1d", "img2d", "img3d"), _build_l2_normalize),
)
