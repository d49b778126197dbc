"""Profiling trees: a deterministic policy that decides, from measured metrics, what to profile.

A tree routes a task on measured metric values (internal nodes: ``feature <= threshold`` goes left,
``>`` goes right) to a leaf naming the metric groups to collect and show to the rewriter. Routing is
sequential, as in the paper: collect what the root needs, route, collect what the next node needs, ...,
collect the leaf's groups, stop. The JSON form is documented in ``trees/README.md``.

Example::

    >>> tree = load_tree({
    ...     "schema_version": 1, "source": "ncu",
    ...     "vocabulary": {"root": {"features": ["sm__throughput.avg.pct_of_peak_sustained_elapsed"],
    ...                             "passes": 9},
    ...                    "memory": {"features": ["lts__t_sector_hit_rate.pct"], "passes": 9}},
    ...     "budget": {"max_depth": 2, "max_groups_per_leaf": 2, "max_passes_per_task": 40},
    ...     "nodes": [
    ...         {"id": "n0", "type": "split", "groups": ["root"], "threshold": 60,
    ...          "feature": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    ...          "children": {"left": "low", "right": "high"}},
    ...         {"id": "low", "type": "leaf", "groups": ["memory"]},
    ...         {"id": "high", "type": "leaf", "groups": []}]})
    >>> tree.apply({"sm__throughput.avg.pct_of_peak_sustained_elapsed": 12.5})
    'low'
    >>> print(export_text(tree), end="")
    |--- sm__throughput.avg.pct_of_peak_sustained_elapsed <= 60.00
    |   |--- leaf low: memory
    |--- sm__throughput.avg.pct_of_peak_sustained_elapsed >  60.00
    |   |--- leaf high: (none)

Modules: ``model`` (nodes, routing, edits, JSON, load/save), ``validation`` (every problem of a JSON
form at once), ``export`` (text and Mermaid).
"""

from autoprofiler.tree.export import export_mermaid, export_text
from autoprofiler.tree.model import (
    Budget,
    GroupSpec,
    Leaf,
    Node,
    ProfilingTree,
    Route,
    RouteError,
    Split,
    Step,
    TreeError,
    load_tree,
    save_tree,
)
from autoprofiler.tree.validation import (
    SCHEMA_VERSION,
    SOURCES,
    CatalogGroup,
    tree_problems,
    vocabulary_from_catalog,
)

__all__ = [
    "SCHEMA_VERSION",
    "SOURCES",
    "Budget",
    "CatalogGroup",
    "GroupSpec",
    "Leaf",
    "Node",
    "ProfilingTree",
    "Route",
    "RouteError",
    "Split",
    "Step",
    "TreeError",
    "export_mermaid",
    "export_text",
    "load_tree",
    "save_tree",
    "tree_problems",
    "vocabulary_from_catalog",
]
