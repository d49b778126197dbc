"""Text and Mermaid exports of a profiling tree (functions of a fitted tree that return a string)."""

from __future__ import annotations

from autoprofiler.tree.model import Leaf, Node, ProfilingTree, Split


def export_text(tree: ProfilingTree, decimals: int = 2, show_split_groups: bool = False) -> str:
    """The tree as indented text, in the style of ``sklearn.tree.export_text``.

    Each split prints two lines, ``feature <= t`` then ``feature >  t`` (two spaces, as sklearn), each
    followed by its subtree; a leaf prints ``leaf <id>: <groups>`` (``(none)`` for no groups). With
    ``show_split_groups`` a split's first line ends with ``  [collect: groups]``.

    Example (the seed tree, abridged)::

        |--- dram__throughput.avg.pct_of_peak_sustained_elapsed <= 60.00
        |   |--- ...
        |--- dram__throughput.avg.pct_of_peak_sustained_elapsed >  60.00
        |   |--- leaf memory: speed_of_light, memory
    """
    lines: list[str] = []

    def walk(node: Node, depth: int):
        indent = "|   " * depth + "|--- "
        if isinstance(node, Leaf):
            lines.append(f"{indent}leaf {node.id}: {', '.join(node.groups) or '(none)'}")
            return
        t = f"{node.threshold:.{decimals}f}"
        extra = f"  [collect: {', '.join(node.groups)}]" if show_split_groups else ""
        lines.append(f"{indent}{node.feature} <= {t}{extra}")
        walk(tree.node(node.left), depth + 1)
        lines.append(f"{indent}{node.feature} >  {t}")
        walk(tree.node(node.right), depth + 1)

    walk(tree.root, 0)
    return "\n".join(lines) + "\n"


def export_mermaid(tree: ProfilingTree, decimals: int = 2) -> str:
    """The tree as a Mermaid flowchart (renders on GitHub inside a ```` ```mermaid ```` block).

    Split nodes are diamonds labelled with the feature (and the groups they collect); edges carry
    ``≤ t`` / ``> t``; leaves are boxes with their id and groups.
    """
    ids = {n.id: f"N{i}" for i, n in enumerate(tree.nodes)}
    out = ["flowchart TD"]
    for n in tree.nodes:
        if isinstance(n, Split):
            out.append(f'    {ids[n.id]}{{"{_mm(n.feature)}<br/>collect: {_mm(", ".join(n.groups))}"}}')
        else:
            out.append(f'    {ids[n.id]}["leaf {_mm(n.id)}<br/>{_mm(", ".join(n.groups) or "(none)")}"]')
    for n in tree.nodes:
        if isinstance(n, Split):
            t = f"{n.threshold:.{decimals}f}"
            out.append(f'    {ids[n.id]} -->|"≤ {t}"| {ids[n.left]}')
            out.append(f'    {ids[n.id]} -->|"> {t}"| {ids[n.right]}')
    return "\n".join(out) + "\n"


def _mm(text: str) -> str:
    return text.replace('"', "#quot;")

