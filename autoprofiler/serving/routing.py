"""The served tree and routing on the metrics a client measured itself (``POST /route``).

A client that profiles on its own machine asks, step by step, what to collect next::

    served = load_served_tree("trees/seed_torch.json")
    step = next_step(served, {})                                  # nothing measured yet
    step.collect                                                  # the root's groups, with pass costs
    step = next_step(served, {"torch__elementwise_time_share": 0.9})
    step.done, step.leaf, step.groups, step.total_passes          # True, 'memory', (...), 0

Routing reads only numbers: no task code is loaded or run here. Each call walks from the root with
every metric given so far (the service keeps no per-client state), so a client resends what it has.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoprofiler.tree import Leaf, ProfilingTree, RouteError, Step, TreeError, load_tree

__all__ = ["GroupCost", "RouteStep", "ServedTree", "load_served_tree", "next_step"]


@dataclass(frozen=True)
class ServedTree:
    """A validated tree as the service holds it.

    Attributes:
        tree: the tree.
        hash: ``tree.fingerprint()``: changes exactly when routing or selection changes.
        policy: the reward-table policy name rows of ``/optimize`` carry (``TreePolicy`` naming).
        origin: where it came from (a path, ``"PUT /tree"``, ``"user_config"``).
        loaded_at: ISO time it was loaded.
        features: every metric the tree's vocabulary knows (to report metrics a client sent in vain).
    """

    tree: ProfilingTree
    hash: str
    policy: str
    origin: str
    loaded_at: str
    features: frozenset[str]

    def info(self) -> dict[str, Any]:
        """``GET /tree``'s answer: hash, policy, profile source, origin, budget and the JSON form."""
        data = self.tree.to_dict()
        return {
            "hash": self.hash,
            "policy": self.policy,
            "source": self.tree.source,
            "origin": self.origin,
            "loaded_at": self.loaded_at,
            "budget": data["budget"],
            "leaves": list(self.tree.leaf_ids),
            "tree": data,
        }


def load_served_tree(spec: str | Path | Mapping[str, Any], origin: str | None = None) -> ServedTree:
    """Load and validate a tree (a JSON path or the JSON form) against the metric catalog.

    Raises:
        TreeError: every problem, each naming its JSON path (also for a file that cannot be read).
    """
    from autoprofiler.policies import TreePolicy
    from autoprofiler.profiling.groups import GROUPS

    where = origin or (str(spec) if not isinstance(spec, Mapping) else "inline")
    try:
        tree = load_tree(spec if isinstance(spec, Mapping) else Path(spec), catalog=GROUPS)
    except OSError as exc:
        raise TreeError([f"(file): cannot read: {exc.strerror or exc}"], where) from None
    features = frozenset(f for spec_ in tree.vocabulary.values() for f in spec_.features)
    now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
    return ServedTree(tree, tree.fingerprint(), TreePolicy(tree).name, where, now, features)


@dataclass(frozen=True)
class GroupCost:
    """A metric group and its replay passes (``None``: unknown or free, e.g. torch.profiler groups)."""

    group: str
    passes: int | None


@dataclass(frozen=True)
class RouteStep:
    """Where a task stands in the tree given the metrics measured so far.

    Attributes:
        done: a leaf is reached.
        node: the split node waiting for a metric, or the leaf reached.
        need: the metric that node reads (``None`` at a leaf).
        collect: groups to collect now (not collected on the way here), with their passes; at a leaf,
            the leaf's groups still to collect.
        path: decisions taken so far, root first.
        leaf, groups: the leaf and the groups it shows the rewriter (``done`` only).
        total: at a leaf, every distinct group collected on the whole path (routing and leaf).
        ignored: metrics given that no group of the tree yields (typos, another source's names).
    """

    done: bool
    node: str
    need: str | None
    collect: tuple[GroupCost, ...]
    path: tuple[Step, ...]
    leaf: str | None = None
    groups: tuple[str, ...] = ()
    total: tuple[GroupCost, ...] = ()
    ignored: tuple[str, ...] = ()

    @property
    def collect_passes(self) -> int:
        return sum(c.passes or 0 for c in self.collect)

    @property
    def total_passes(self) -> int:
        return sum(c.passes or 0 for c in self.total)

    def as_dict(self) -> dict[str, Any]:
        """The JSON answer of ``POST /route`` (without the tree and task fields the endpoint adds)."""
        costs = lambda cs: [{"group": c.group, "passes": c.passes} for c in cs]
        return {
            "done": self.done,
            "node": self.node,
            "need": self.need,
            "collect": costs(self.collect),
            "collect_passes": self.collect_passes,
            "path": [s._asdict() for s in self.path],
            "leaf": self.leaf,
            "groups": list(self.groups),
            "total": costs(self.total),
            "total_passes": self.total_passes if self.done else None,
            "unknown_cost": [c.group for c in (self.total or self.collect) if c.passes is None],
            "ignored_metrics": list(self.ignored),
        }


def next_step(served: ServedTree, metrics: Mapping[str, float]) -> RouteStep:
    """Walk ``served``'s tree from the root on ``metrics``; stop at the first node whose metric is missing.

    Raises:
        RouteError: a metric the walk reads is not a finite number.
    """
    tree = served.tree
    cost = lambda names: tuple(GroupCost(g, tree.vocabulary[g].passes) for g in names)
    ignored = tuple(sorted(name for name in metrics if name not in served.features))
    node, path, collected = tree.root, [], []
    while not isinstance(node, Leaf):
        if node.feature not in metrics:
            fresh = [g for g in node.groups if g not in collected] or list(node.groups)
            return RouteStep(False, node.id, node.feature, cost(fresh), tuple(path), ignored=ignored)
        value = float(metrics[node.feature])
        if not math.isfinite(value):
            raise RouteError(f"metrics.{node.feature}: expected a finite number, got {value!r}")
        went = "left" if value <= node.threshold else "right"
        path.append(Step(node.id, node.feature, value, node.threshold, went))
        collected += [g for g in node.groups if g not in collected]
        node = tree.node(node.left if went == "left" else node.right)
    fresh = [g for g in node.groups if g not in collected]
    total = collected + fresh
    return RouteStep(
        True, node.id, None, cost(fresh), tuple(path), node.id, node.groups, cost(total), ignored
    )
