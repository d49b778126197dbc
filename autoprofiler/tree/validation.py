"""Validation of a profiling tree's JSON form: every problem at once, each naming its JSON path.

``tree_problems(data, catalog)`` is the one check, used when a tree is loaded, built or edited. With a
catalog (group name -> ``MetricGroup``, ``autoprofiler.profiling.GROUPS``) it also checks each group
against the catalog; ``CatalogGroup`` is what it reads of a catalog entry.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

log = logging.getLogger("autoprofiler.tree")

SCHEMA_VERSION = 1
SOURCES = ("ncu", "torch")
NODE_TYPES = ("split", "leaf")
BUDGET_KEYS = ("max_depth", "max_groups_per_leaf", "max_passes_per_task")
_TOP_KEYS = {"schema_version", "source", "vocabulary", "budget", "provenance", "nodes"}
_SPLIT_KEYS = {"id", "type", "feature", "threshold", "groups", "children"}
_LEAF_KEYS = {"id", "type", "groups", "label"}


class CatalogGroup(Protocol):
    """What the tree reads of a catalog group (``autoprofiler.profiling.MetricGroup`` is one)."""

    source: str
    metrics: tuple[str, ...]
    passes: int | None


Catalog = Mapping[str, CatalogGroup]


def vocabulary_from_catalog(names: Iterable[str], catalog: Catalog) -> dict[str, dict]:
    """The JSON ``vocabulary`` block for the named catalog groups (for writing trees by hand or script).

    Example: ``vocabulary_from_catalog(["root", "memory"], GROUPS)``.
    """
    return {n: {"features": list(catalog[n].metrics), "passes": catalog[n].passes} for n in names}


# --- validation -------------------------------------------------------------------------------------------
def _is_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _type_name(x: Any) -> str:
    return f"{x!r} ({type(x).__name__})"


def tree_problems(data: Any, catalog: Catalog | None = None) -> list[str]:
    """Every problem with a tree's JSON form, each naming its JSON path; ``[]`` when it is valid.

    Checks: keys and types; schema version; source; vocabulary (and, with ``catalog``, that each group
    exists there with the tree's source and holds the listed features); unique node ids; each node's
    groups are in the vocabulary and a split's feature belongs to one of them; thresholds are finite
    numbers; children exist, have one parent and are not the root (no cycles); every node is reachable;
    the budget (depth, groups per leaf, passes per task on every root-to-leaf path).
    """
    p: list[str] = []
    if not isinstance(data, Mapping):
        return [f"(top): expected a JSON object, got {type(data).__name__}"]
    for key in sorted(set(data) - _TOP_KEYS):
        p.append(f"{key}: unknown key (expected: {', '.join(sorted(_TOP_KEYS))})")
    for key in sorted(_TOP_KEYS - {"provenance"} - set(data)):
        p.append(f"{key}: missing")
    if "schema_version" in data and data["schema_version"] != SCHEMA_VERSION:
        p.append(f"schema_version: expected {SCHEMA_VERSION}, got {data['schema_version']!r}")
    source = data.get("source")
    if "source" in data and source not in SOURCES:
        p.append(f"source: expected one of {list(SOURCES)}, got {source!r}")
    if "provenance" in data and not isinstance(data["provenance"], Mapping):
        p.append(f"provenance: expected an object, got {type(data['provenance']).__name__}")

    passes = _check_vocabulary(data.get("vocabulary", {}), source, catalog, p)
    budget = _check_budget(data.get("budget", {}), p)
    nodes = data.get("nodes", [])
    if not isinstance(nodes, list) or not nodes:
        if "nodes" in data:
            p.append(f"nodes: expected a non-empty list of nodes, got {_type_name(nodes)}")
        return p
    index = _check_nodes(nodes, data.get("vocabulary", {}), p)
    if index is not None:
        _check_structure(nodes, index, budget, passes, p)
    return p


def _check_vocabulary(
    vocab: Any, source: Any, catalog: Catalog | None, p: list[str]
) -> dict[str, int | None]:
    """Problems in ``vocabulary``; returns group -> passes (catalog's when the vocabulary has none)."""
    passes: dict[str, int | None] = {}
    if not isinstance(vocab, Mapping):
        p.append(
            "vocabulary: expected an object mapping group name -> {features, passes}, "
            f"got {_type_name(vocab)}"
        )
        return passes
    for name, spec in vocab.items():
        where = f"vocabulary.{name}"
        if not isinstance(spec, Mapping):
            p.append(f"{where}: expected an object with 'features' and 'passes', got {_type_name(spec)}")
            continue
        for key in sorted(set(spec) - {"features", "passes"}):
            p.append(f"{where}.{key}: unknown key (expected: features, passes)")
        features = spec.get("features")
        if not isinstance(features, list) or not all(isinstance(f, str) and f for f in features):
            p.append(f"{where}.features: expected a list of metric names, got {_type_name(features)}")
            features = []
        n = spec.get("passes")
        if n is not None and not _is_count(n):
            p.append(f"{where}.passes: expected a non-negative integer or null, got {_type_name(n)}")
            n = None
        if catalog is not None:
            group = catalog.get(name)
            if group is None:
                p.append(f"{where}: group {name!r} is not in the metric catalog")
            else:
                if group.source != source:
                    p.append(
                        f"{where}: catalog group {name!r} has source {group.source!r}, "
                        f"the tree {source!r}"
                    )
                known = set(group.metrics)
                for i, f in enumerate(features):
                    if f not in known:
                        p.append(f"{where}.features[{i}]: {f!r} is not a metric of catalog group {name!r}")
                cat_passes = group.passes
                if n is None:
                    n = cat_passes
                elif cat_passes is not None and cat_passes != n:
                    log.warning(
                        "%s.passes is %s, the catalog says %s; using the tree's", where, n, cat_passes
                    )
        passes[name] = n
    return passes


def _check_budget(budget: Any, p: list[str]) -> dict[str, int | None]:
    out = dict.fromkeys(BUDGET_KEYS)
    if not isinstance(budget, Mapping):
        p.append(f"budget: expected an object with keys {', '.join(BUDGET_KEYS)}, got {_type_name(budget)}")
        return out
    for key in sorted(set(budget) - set(BUDGET_KEYS)):
        p.append(f"budget.{key}: unknown key (expected: {', '.join(BUDGET_KEYS)})")
    for key in BUDGET_KEYS:
        value = budget.get(key)
        if value is not None and not _is_count(value):
            p.append(f"budget.{key}: expected a non-negative integer or null, got {_type_name(value)}")
        else:
            out[key] = value
    return out


def _check_nodes(nodes: list, vocab: Any, p: list[str]) -> dict[str, int] | None:
    """Per-node problems; returns id -> index, or None when the nodes are too broken to walk."""
    vocab = vocab if isinstance(vocab, Mapping) else {}
    index: dict[str, int] = {}
    walkable = True
    for i, node in enumerate(nodes):
        where = f"nodes[{i}]"
        if not isinstance(node, Mapping):
            p.append(f"{where}: expected a node object, got {_type_name(node)}")
            walkable = False
            continue
        node_id = node.get("id")
        if not isinstance(node_id, str) or not node_id:
            p.append(f"{where}.id: expected a non-empty string, got {_type_name(node_id)}")
            walkable = False
        elif node_id in index:
            p.append(f"{where}.id: duplicate id {node_id!r} (first at nodes[{index[node_id]}])")
            walkable = False
        else:
            index[node_id] = i
        kind = node.get("type")
        if kind not in NODE_TYPES:
            p.append(f"{where}.type: expected one of {list(NODE_TYPES)}, got {kind!r}")
            walkable = False
            continue
        allowed = _SPLIT_KEYS if kind == "split" else _LEAF_KEYS
        for key in sorted(set(node) - allowed):
            p.append(f"{where}.{key}: unknown key for a {kind} node (expected: {', '.join(sorted(allowed))})")
        groups = node.get("groups")
        if not isinstance(groups, list):
            p.append(f"{where}.groups: expected a list of group names, got {_type_name(groups)}")
            groups = []
        seen = set()
        for j, g in enumerate(groups):
            if not isinstance(g, str) or g not in vocab:
                p.append(
                    f"{where}.groups[{j}]: unknown group {g!r} (vocabulary: {', '.join(vocab) or 'empty'})"
                )
            elif g in seen:
                p.append(f"{where}.groups[{j}]: group {g!r} listed twice")
            seen.add(g)
        if kind == "leaf":
            if "label" in node and not isinstance(node["label"], str):
                p.append(f"{where}.label: expected a string, got {_type_name(node['label'])}")
            continue
        _check_split(node, where, [g for g in groups if g in vocab], vocab, p)
        children = node.get("children")
        if not isinstance(children, Mapping) or not all(
            isinstance(children.get(s), str) for s in ("left", "right")
        ):
            p.append(f"{where}.children: expected {{'left': id, 'right': id}}, got {_type_name(children)}")
            walkable = False
        elif set(children) - {"left", "right"}:
            p.append(
                f"{where}.children: unknown keys {sorted(set(children) - {'left', 'right'})} "
                "(expected: left, right)"
            )
    return index if walkable else None


def _check_split(node: Mapping, where: str, groups: list[str], vocab: Mapping, p: list[str]) -> None:
    threshold = node.get("threshold")
    if not _is_number(threshold):
        p.append(f"{where}.threshold: expected a finite number, got {_type_name(threshold)}")
    feature = node.get("feature")
    if not isinstance(feature, str) or not feature:
        p.append(f"{where}.feature: expected a metric name, got {_type_name(feature)}")
        return

    def features(g):
        spec = vocab.get(g)
        return spec.get("features") or [] if isinstance(spec, Mapping) else []

    if any(feature in features(g) for g in groups):
        return
    holders = [g for g in vocab if feature in features(g)]
    if holders:
        p.append(
            f"{where}.feature: {feature!r} is not in the groups this node declares "
            f"({', '.join(groups) or 'none'}); "
            f"it is in: {', '.join(holders)}"
        )
    else:
        p.append(f"{where}.feature: unknown feature {feature!r} (not in any vocabulary group)")


def _check_structure(nodes: list, index: dict[str, int], budget: dict, passes: dict, p: list[str]) -> None:
    """Children exist, one parent each, no cycles, all reachable; then the budget on each path."""
    root_id = nodes[0]["id"]
    parent: dict[str, str] = {}
    broken = False
    for i, node in enumerate(nodes):
        if node["type"] != "split":
            continue
        for side in ("left", "right"):
            child = node["children"][side]
            where = f"nodes[{i}].children.{side}"
            if child not in index:
                p.append(f"{where}: node {child!r} does not exist")
                broken = True
            elif child == node["id"] or child == root_id:
                p.append(
                    f"{where}: {child!r} points back to "
                    f"{'itself' if child == node['id'] else 'the root'} (cycle)"
                )
                broken = True
            elif child in parent:
                p.append(
                    f"{where}: node {child!r} already has parent {parent[child]!r} "
                    "(a tree node has one parent)"
                )
                broken = True
            else:
                parent[child] = node["id"]
    # Walk from the root; with one parent per node and the root parentless, a cycle shows as unreachable.
    reached, stack = set(), [root_id]
    while stack:
        nid = stack.pop()
        if nid in reached or nid not in index:
            continue
        reached.add(nid)
        node = nodes[index[nid]]
        if node["type"] == "split":
            stack += [node["children"]["right"], node["children"]["left"]]
    for nid, i in index.items():
        if nid not in reached:
            p.append(f"nodes[{i}]: node {nid!r} is unreachable from the root {root_id!r} (or on a cycle)")
            broken = True
    if broken:
        return
    _check_budget_paths(nodes, index, root_id, budget, passes, p)


def _check_budget_paths(nodes, index, root_id, budget, passes, p) -> None:
    def walk(nid: str, depth: int, groups: list[str], trail: list[str]):
        i = index[nid]
        node = nodes[i]
        groups = groups + [g for g in node["groups"] if g not in groups]
        trail = trail + [nid]
        if node["type"] == "split":
            walk(node["children"]["left"], depth + 1, groups, trail)
            walk(node["children"]["right"], depth + 1, groups, trail)
            return
        where, route = f"nodes[{i}]", " > ".join(trail)
        if budget["max_depth"] is not None and depth > budget["max_depth"]:
            p.append(
                f"{where}: leaf {nid!r} is at depth {depth} > budget.max_depth "
                f"{budget['max_depth']} ({route})"
            )
        n_leaf = len(node["groups"])
        if budget["max_groups_per_leaf"] is not None and n_leaf > budget["max_groups_per_leaf"]:
            p.append(
                f"{where}.groups: leaf {nid!r} has {n_leaf} groups > budget.max_groups_per_leaf "
                f"{budget['max_groups_per_leaf']}"
            )
        cost = sum(passes.get(g) or 0 for g in groups)
        if budget["max_passes_per_task"] is not None and cost > budget["max_passes_per_task"]:
            p.append(
                f"{where}: path to leaf {nid!r} costs {cost} passes > budget.max_passes_per_task "
                f"{budget['max_passes_per_task']} ({route}; groups {', '.join(groups)})"
            )

    walk(root_id, 0, [], [])

