"""The report's PNGs (matplotlib, Agg backend): bar charts that carry their values, the drawing of a
profiling tree and the refinement curve."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(
    path: Path,
    labels: Sequence[str],
    values: Sequence[float],
    title: str,
    xlabel: str,
    base: float = 0.0,
    fmt: str = ".3f",
    marks: Sequence[float | None] = (),
    mark_label: str = "",
) -> Path:
    """Horizontal bars from ``base`` (1.0 for speedups: a bar to the left is a slowdown), each with its
    value written at its end. ``marks`` (one per bar, None for none): a black diamond on a bar's row, for
    a value it is compared with (drawn where it differs from the bar), named ``mark_label`` in a legend."""
    plt = _plt()
    from matplotlib.ticker import MaxNLocator

    values = [float(v) for v in values]
    drawn = [(i, float(m)) for i, m in enumerate(marks) if m is not None and abs(float(m) - values[i]) > 1e-9]
    fig, ax = plt.subplots(figsize=(6.4, 0.9 + 0.36 * len(labels)))
    colors = ["#4C72B0" if v >= base else "#DD8452" for v in values]
    bars = ax.barh(range(len(labels)), [v - base for v in values], left=base, color=colors, height=0.6)
    ax.bar_label(bars, labels=[format(v, fmt) for v in values], padding=3, fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    if all(v == int(v) for v in values):  # counts: whole-number ticks
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if drawn:  # the diamonds explained under the axis: a legend box would cover bars
        ax.scatter([m for _, m in drawn], [i for i, _ in drawn], marker="D", s=22, color="black", zorder=3)
        for i, m in drawn:
            ax.annotate(format(m, fmt), (m, i), xytext=(6, 0), textcoords="offset points", fontsize=7,
                        ha="left", va="center", color="#333333")  # fmt: skip
        xlabel = f"{xlabel}\n\u25c6 {mark_label}"
    ax.invert_yaxis()  # first label on top, as in the table
    ax.axvline(base, color="grey", lw=0.8)
    everything = [*values, *(m for _, m in drawn), base]
    lo, hi = min(everything), max(everything)
    span = (hi - lo) or abs(hi) or 1.0
    ax.set_xlim(lo - (0.18 * span if lo < base else 0.02 * span), hi + 0.18 * span)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_tree(tree: Any, path: Path) -> Path:
    """A PNG of a profiling tree: splits (feature, the groups collected there), edges labelled with the
    threshold test, leaves with their groups. The canvas is cropped to the drawing."""
    plt = _plt()
    from autoprofiler.tree import Split

    pos: dict[str, tuple[float, float]] = {}
    leaves = [0]

    def place(node_id: str, depth: int) -> float:
        node = tree.node(node_id)
        if isinstance(node, Split):
            x = (place(node.left, depth + 1) + place(node.right, depth + 1)) / 2
        else:
            x = float(leaves[0])
            leaves[0] += 1
        pos[node_id] = (x, -depth)
        return x

    place(tree.root.id, 0)
    texts = {}
    for node in tree.nodes:
        if isinstance(node, Split):
            texts[node.id] = f"{node.feature}\ncollect: {', '.join(node.groups) or '(none)'}"
        else:
            texts[node.id] = f"leaf {node.id}\n" + ("\n".join(node.groups) or "(no groups)")
    longest = max(len(line) for t in texts.values() for line in t.splitlines())
    unit = min(max(1.8, 0.062 * longest), 4.2)  # inches per leaf: the widest label fits
    fig, ax = plt.subplots(figsize=(unit * max(leaves[0], 1), 0.9 + 1.4 * tree.depth))
    for node in tree.nodes:
        x, y = pos[node.id]
        if isinstance(node, Split):
            for child, test in ((node.left, "≤"), (node.right, ">")):
                cx, cy = pos[child]
                ax.plot([x, cx], [y, cy], color="grey", lw=0.9, zorder=1)
                ax.text(
                    (x + cx) / 2,
                    (y + cy) / 2,
                    f"{test} {node.threshold:g}",
                    fontsize=8,
                    ha="center",
                    va="center",
                    bbox={"fc": "white", "ec": "none", "pad": 0.8},
                    zorder=2,
                )
        color = "#DDE8F5" if isinstance(node, Split) else "#E3F1DF"
        ax.text(
            x,
            y,
            texts[node.id],
            ha="center",
            va="center",
            fontsize=8,
            zorder=3,
            bbox={"boxstyle": "round,pad=0.45", "fc": color, "ec": "#555555"},
        )
    ax.set_xlim(-0.5, max(leaves[0], 1) - 0.5)
    ax.set_ylim(-tree.depth - 0.3, 0.3)  # the boxes, not a margin of blank canvas
    ax.axis("off")
    n = len(tree.leaf_ids)
    title = f"profiling tree {tree.fingerprint()}: {n} {'leaf' if n == 1 else 'leaves'}, depth {tree.depth}"
    if n == 1:  # nothing to route on: say so, or the lone box reads like a drawing that failed
        title += "\none leaf: every task is shown these groups (no split was learned)"
    ax.set_title(title, fontsize=9)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.2)
    plt.close(fig)
    return path


def _refinement_curve(path: Path, rounds: Sequence[int], xs: Sequence[float], ys: Sequence[float]) -> Path:
    """Geomean cumulative speedup (``ys``) over mean cumulative seconds per task (``xs``), one point per
    round, each labelled with its round and speedup."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot(xs, ys, marker="o")
    for k, x, y in zip(rounds, xs, ys, strict=True):
        ax.annotate(f"round {k}: {y:.3f}x", (x, y), fontsize=8, textcoords="offset points", xytext=(4, 4))
    ax.margins(x=0.25, y=0.15)  # room for the labels
    ax.set_xlabel("mean cumulative seconds per task (profiling + evaluation)")
    ax.set_ylabel("geomean cumulative speedup")
    ax.set_title("iterative refinement", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
