"""The profiling tree as plain data: nodes, routing (one node's groups at a time), edits, JSON.

See ``autoprofiler.tree`` for the overview and an example; validation lives in ``validation.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from autoprofiler.tree.validation import BUDGET_KEYS, SCHEMA_VERSION, Catalog, CatalogGroup, tree_problems

if TYPE_CHECKING:
    from autoprofiler.tasks import Task

log = logging.getLogger("autoprofiler.tree")


class Collected(Protocol):
    """What routing reads of one collection: metric values, its cost, and a merge with the next one
    (``autoprofiler.profiling.Profile`` is one)."""

    metrics: Mapping[str, float]
    passes: int
    seconds: float

    def merge(self, other: Collected) -> Collected: ...


class TreeProfiler(Protocol):
    """What routing needs of a profiler: the groups' profile of one task (``Profiler``,
    ``RecordedProfiler``)."""

    def collect(self, task: Task, groups: list[str]) -> Collected: ...


@runtime_checkable
class BatchProfiler(TreeProfiler, Protocol):
    """A profiler that also collects many tasks in one call (one ncu process for the batch)."""

    def collect_many(self, tasks: list[Task], groups: list[str]) -> list[Collected]: ...


def _spec_from_catalog(group: CatalogGroup) -> GroupSpec:
    return GroupSpec(tuple(group.metrics), group.passes)


class TreeError(ValueError):
    """A tree that does not validate. ``problems`` lists every problem, each naming its JSON path."""

    def __init__(self, problems: Iterable[str], origin: str = ""):
        self.problems = list(problems)
        where = f" ({origin})" if origin else ""
        head = f"invalid profiling tree{where}: {len(self.problems)} problem(s)"
        super().__init__(head + "".join(f"\n  - {p}" for p in self.problems))


class RouteError(RuntimeError):
    """Routing could not proceed: a node's feature is missing from (or NaN in) the collected profile."""


@dataclass(frozen=True)
class GroupSpec:
    """What the tree knows about one metric group.

    Attributes:
        features: the metric names (ncu names verbatim, or ``torch__...``) the group yields; a split
            node may route only on a feature of a group it declares.
        passes: replay passes the group costs on its own (ncu), ``None`` when unknown or free (torch).
    """

    features: tuple[str, ...]
    passes: int | None = None


@dataclass(frozen=True)
class Budget:
    """Bounds on tree complexity and on what one task costs; ``None`` means unbounded.

    Attributes:
        max_depth: most split nodes on any root-to-leaf path (a lone leaf has depth 0).
        max_groups_per_leaf: most groups a leaf may name (what the rewriter is shown).
        max_passes_per_task: most replay passes along any root-to-leaf path: the sum of the known
            ``passes`` of every distinct group collected on the path (routing groups and the leaf's).
    """

    max_depth: int | None = None
    max_groups_per_leaf: int | None = None
    max_passes_per_task: int | None = None


@dataclass(frozen=True)
class Split:
    """A split node: collect ``groups``, then go ``left`` if ``metrics[feature] <= threshold`` else ``right``.

    Invariants: ``feature`` belongs to one of ``groups``; ``left`` and ``right`` are ids of other nodes
    of the same tree, each with exactly one parent.
    """

    id: str
    feature: str
    threshold: float
    groups: tuple[str, ...]
    left: str
    right: str


@dataclass(frozen=True)
class Leaf:
    """A leaf: the groups to collect and show to the rewriter (may be empty: show nothing).

    ``label`` is free text for humans (e.g. the fixed configuration the leaf started from).
    """

    id: str
    groups: tuple[str, ...]
    label: str = ""


Node = Split | Leaf


class Step(NamedTuple):
    """One routing decision: the node, the feature read, its value, the threshold, and where it went."""

    node: str
    feature: str
    value: float
    threshold: float
    went: str  # "left" (value <= threshold) or "right"


@dataclass(frozen=True)
class Route:
    """The result of routing one task with a profiler.

    Attributes:
        leaf: the leaf id reached.
        path: the decisions taken, root first.
        groups: every group collected, in the order it was asked for (routing groups, then the leaf's).
        leaf_groups: the leaf's groups (what the rewriter is shown).
        profile: everything collected, merged (``None`` when nothing was collected).
        passes: replay passes spent by the profiler calls of this route.
        seconds: wall seconds the profiler calls of this route reported.
    """

    leaf: str
    path: tuple[Step, ...]
    groups: tuple[str, ...]
    leaf_groups: tuple[str, ...]
    profile: Collected | None
    passes: int
    seconds: float


@dataclass(frozen=True)
class ProfilingTree:
    """A profiling tree: plain data, validated on construction (raises :class:`TreeError`).

    Attributes:
        source: ``"ncu"`` or ``"torch"``: where every group of the tree comes from.
        vocabulary: group name -> :class:`GroupSpec`: the groups the tree may use, with their features
            and pass costs. Every group a node names is here.
        budget: the :class:`Budget` every root-to-leaf path respects.
        nodes: ``nodes[0]`` is the root; ids are unique; every node but the root has exactly one
            parent; every node is reachable from the root (so there are no cycles).
        provenance: free dict: the config and data the tree was learned from, its name, the date.
        schema_version: the JSON schema version (``SCHEMA_VERSION``).

    Trees are never mutated: the edits :meth:`rewrite_leaf` and :meth:`split_leaf` return new trees.
    """

    source: str
    vocabulary: Mapping[str, GroupSpec]
    budget: Budget
    nodes: tuple[Node, ...]
    provenance: Mapping[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    def __post_init__(self):
        object.__setattr__(self, "nodes", tuple(self.nodes))
        problems = tree_problems(self.to_dict())
        if problems:
            raise TreeError(problems)

    # --- lookups -------------------------------------------------------------------------------------
    @cached_property
    def _index(self) -> dict[str, Node]:
        return {n.id: n for n in self.nodes}

    @cached_property
    def _parents(self) -> dict[str, str]:
        return {c: n.id for n in self.nodes if isinstance(n, Split) for c in (n.left, n.right)}

    @property
    def root(self) -> Node:
        return self.nodes[0]

    def node(self, node_id: str) -> Node:
        """The node with that id; ``KeyError`` naming the known ids otherwise."""
        try:
            return self._index[node_id]
        except KeyError:
            raise KeyError(f"no node {node_id!r} in the tree (nodes: {', '.join(self._index)})") from None

    def leaf(self, leaf_id: str) -> Leaf:
        """The leaf with that id; ``KeyError`` if there is none or the node is a split."""
        node = self.node(leaf_id)
        if not isinstance(node, Leaf):
            raise KeyError(
                f"node {leaf_id!r} is a split node, not a leaf (leaves: {', '.join(self.leaf_ids)})"
            )
        return node

    @property
    def leaf_ids(self) -> tuple[str, ...]:
        """Leaf ids in node order."""
        return tuple(n.id for n in self.nodes if isinstance(n, Leaf))

    def path_to(self, node_id: str) -> tuple[Node, ...]:
        """The nodes from the root down to ``node_id`` (both included)."""
        self.node(node_id)
        chain = [node_id]
        while chain[-1] in self._parents:
            chain.append(self._parents[chain[-1]])
        return tuple(self._index[i] for i in reversed(chain))

    def groups_on_path(self, leaf_id: str) -> tuple[str, ...]:
        """Every distinct group collected when a task reaches ``leaf_id``, in collection order."""
        out: list[str] = []
        for node in self.path_to(leaf_id):
            out += [g for g in node.groups if g not in out]
        return tuple(out)

    @property
    def depth(self) -> int:
        """Most split nodes on a root-to-leaf path."""
        return max(sum(isinstance(n, Split) for n in self.path_to(leaf)) for leaf in self.leaf_ids)

    def fingerprint(self) -> str:
        """A short hash of what decides routing and selection (source and nodes): a stable policy name.

        Provenance, budget and vocabulary (whose pass costs fill in once measured) do not change it.
        """
        d = self.to_dict()
        key = json.dumps({"source": d["source"], "nodes": d["nodes"]}, sort_keys=True)
        return hashlib.sha256(key.encode()).hexdigest()[:12]

    # --- routing -------------------------------------------------------------------------------------
    def decision_path(self, metrics: Mapping[str, float] | Collected) -> tuple[str, tuple[Step, ...]]:
        """Route on already-collected metrics (a ``Profile`` or a mapping of metric name -> value).

        Returns:
            ``(leaf_id, path)``.
        Raises:
            RouteError: a node's feature is missing from ``metrics`` or is NaN.
        """
        values = metrics if isinstance(metrics, Mapping) else metrics.metrics
        node, path = self.root, []
        while isinstance(node, Split):
            value = _feature_value(node, values)
            went = "left" if value <= node.threshold else "right"
            path.append(Step(node.id, node.feature, value, node.threshold, went))
            node = self._index[node.left if went == "left" else node.right]
        return node.id, tuple(path)

    def apply(self, metrics: Mapping[str, float] | Collected) -> str:
        """The leaf id ``metrics`` (a ``Profile`` or a mapping) routes to; see :meth:`decision_path`."""
        return self.decision_path(metrics)[0]

    def route(self, task: Task, profiler: TreeProfiler) -> Route:
        """Route ``task`` by collecting, one node at a time, only what the next decision needs.

        ``profiler.collect(task, groups)`` is called with the groups a node needs that were not
        collected yet (root first, then each node on the way down, then the leaf's); no call is made
        for a node whose groups are all collected already. The profiles returned are merged.

        Raises:
            RouteError: the profile collected for a node lacks the node's feature (or it is NaN).

        Example::

            route = tree.route(task, Profiler(source="torch", device="cpu", task_size="small"))
            route.leaf, [(s.node, s.value, s.went) for s in route.path], route.passes
        """
        walk = _Walk(self, task, self.root)
        while True:
            missing = walk.missing()
            if missing:
                walk.take(profiler.collect(task, list(missing)), missing)
            done = walk.step()
            if done is not None:
                return done

    def route_many(self, tasks: Iterable[Task], profiler: TreeProfiler) -> list[Route | Exception]:
        """Route many tasks, batching collection: each task collects exactly what :meth:`route` would.

        The walks advance together, one level at a time; tasks that need the same missing groups at
        the same step share one ``profiler.collect_many(tasks, groups)`` call (one profiled process
        for ncu: a few calls per tree level instead of two or more per task) when the profiler has
        it, else ``collect`` is called per task. A task whose collection or routing fails gets the
        exception in its slot instead of a :class:`Route`: failures are data, nothing is raised.

        When a batch fails, its tasks are collected one at a time; those the batch had already
        collected then report the cost of that second call (0: the profiler keeps them in memory).

        Example::

            for task, r in zip(tasks, tree.route_many(tasks, profiler)):
                print(task.id, r.leaf if isinstance(r, Route) else f"failed: {r}")
        """
        walks = [_Walk(self, task, self.root) for task in tasks]
        results: list[Route | Exception | None] = [None] * len(walks)
        active = list(range(len(walks)))
        while active:
            batches: dict[tuple[str, ...], list[int]] = {}
            for i in active:
                missing = walks[i].missing()
                if missing:
                    batches.setdefault(missing, []).append(i)
            for missing, members in batches.items():
                got = _collect_batch(profiler, [walks[i].task for i in members], missing)
                for i, profile in zip(members, got, strict=True):
                    if isinstance(profile, Exception):
                        results[i] = profile
                    else:
                        walks[i].take(profile, missing)
            still = []
            for i in active:
                if results[i] is not None:
                    continue
                try:
                    results[i] = walks[i].step()
                except RouteError as exc:
                    results[i] = exc
                if results[i] is None:
                    still.append(i)
            active = still
        return results

    # --- edits (each returns a new, validated tree) ---------------------------------------------------
    def rewrite_leaf(
        self, leaf_id: str, add_groups: Iterable[str], catalog: Catalog | None = None
    ) -> ProfilingTree:
        """REWRITE: a new tree whose leaf ``leaf_id`` also collects ``add_groups``.

        Groups not in the vocabulary are taken from ``catalog`` (name -> ``MetricGroup``) when given.

        Raises:
            KeyError: no such leaf. TreeError: an unknown group, or the budget is exceeded.

        Example: ``tree.rewrite_leaf("memory", ["stalls"])``.
        """
        leaf = self.leaf(leaf_id)
        add = _as_groups(add_groups, "add_groups")
        groups = leaf.groups + tuple(g for g in dict.fromkeys(add) if g not in leaf.groups)
        return self._replace_nodes({leaf_id: [dataclasses.replace(leaf, groups=groups)]}, add, catalog)

    def split_leaf(
        self,
        leaf_id: str,
        feature: str,
        threshold: float,
        left_groups: Iterable[str] | None = None,
        right_groups: Iterable[str] | None = None,
        groups: Iterable[str] | None = None,
        catalog: Catalog | None = None,
        left_id: str | None = None,
        right_id: str | None = None,
    ) -> ProfilingTree:
        """SPLIT: a new tree where leaf ``leaf_id`` becomes a split node on ``feature <= threshold``.

        The split node keeps the leaf's id (so its parent is unchanged); its children are new leaves
        ``left_id`` (default ``"<leaf_id>.le"``) and ``right_id`` (default ``"<leaf_id>.gt"``) holding
        ``left_groups`` / ``right_groups`` (default: the old leaf's groups). The split node collects
        ``groups`` (default: one group holding ``feature``: preferably one already collected on the
        path, else one of the leaf's groups, else the cheapest in the vocabulary or ``catalog``).

        Raises:
            KeyError: no such leaf. TreeError: unknown feature or group, id clash, budget exceeded.

        Example: ``tree.split_leaf("memory", "lts__t_sector_hit_rate.pct", 50.0, right_groups=["stalls"])``.
        """
        leaf = self.leaf(leaf_id)
        left_groups = leaf.groups if left_groups is None else _as_groups(left_groups, "left_groups")
        right_groups = leaf.groups if right_groups is None else _as_groups(right_groups, "right_groups")
        if groups is None:
            groups = (self._group_for_feature(leaf_id, feature, catalog),)
        else:
            groups = _as_groups(groups, "groups")
        left_id = f"{leaf_id}.le" if left_id is None else left_id
        right_id = f"{leaf_id}.gt" if right_id is None else right_id
        try:
            threshold = float(threshold)
        except (TypeError, ValueError):
            raise TreeError([f"split_leaf threshold: expected a number, got {threshold!r}"]) from None
        new = [
            Split(leaf_id, feature, threshold, groups, left_id, right_id),
            Leaf(left_id, left_groups),
            Leaf(right_id, right_groups),
        ]
        return self._replace_nodes({leaf_id: new}, left_groups + right_groups + groups, catalog)

    def _group_for_feature(self, leaf_id: str, feature: str, catalog: Catalog | None) -> str:
        vocab = dict(self.vocabulary)
        if catalog is not None:
            for name, group in catalog.items():
                if name not in vocab and group.source == self.source:
                    vocab[name] = _spec_from_catalog(group)
        holders = [name for name, spec in vocab.items() if feature in spec.features]
        if not holders:
            raise TreeError([f"split_leaf feature: {feature!r} is not a feature of any known group"])
        for preferred in (self.groups_on_path(leaf_id), self.leaf(leaf_id).groups):
            for name in preferred:
                if name in holders:
                    return name
        return min(holders, key=lambda n: (vocab[n].passes is None, vocab[n].passes or 0, n))

    def _replace_nodes(self, replace: dict[str, list[Node]], used: Iterable[str], catalog) -> ProfilingTree:
        nodes: list[Node] = []
        for n in self.nodes:
            nodes += replace.get(n.id, [n])
        vocabulary = dict(self.vocabulary)
        if catalog is not None:
            for name in used:
                if name not in vocabulary and name in catalog:
                    vocabulary[name] = _spec_from_catalog(catalog[name])
        return dataclasses.replace(self, nodes=tuple(nodes), vocabulary=vocabulary)

    # --- JSON ------------------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The JSON form (see ``trees/README.md``), as plain Python data."""
        return {
            "schema_version": self.schema_version,
            "source": self.source,
            "vocabulary": {
                name: {"features": list(spec.features), "passes": spec.passes}
                for name, spec in self.vocabulary.items()
            },
            "budget": dataclasses.asdict(self.budget),
            "provenance": dict(self.provenance),
            "nodes": [_node_to_dict(n) for n in self.nodes],
        }

    def to_json(self, indent: int | None = 2) -> str:
        """The JSON text of :meth:`to_dict`."""
        return json.dumps(self.to_dict(), indent=indent) + "\n"

    @classmethod
    def from_dict(cls, data: Any, catalog: Catalog | None = None, origin: str = "") -> ProfilingTree:
        """Validate ``data`` (the JSON form) and build the tree; see :func:`load_tree`."""
        problems = tree_problems(data, catalog)
        if problems:
            raise TreeError(problems, origin)
        vocabulary = {}
        for name, spec in data["vocabulary"].items():
            passes = spec.get("passes")
            if passes is None and catalog is not None:  # the catalog's measured cost fills a gap
                passes = catalog[name].passes
            vocabulary[name] = GroupSpec(tuple(spec["features"]), passes)
        budget = Budget(**{k: data["budget"].get(k) for k in BUDGET_KEYS})
        nodes = tuple(_node_from_dict(n) for n in data["nodes"])
        return cls(
            data["source"],
            vocabulary,
            budget,
            nodes,
            dict(data.get("provenance") or {}),
            data["schema_version"],
        )


@dataclass
class _Walk:
    """One task's routing in progress: where it is, what it collected and spent (route, route_many)."""

    tree: ProfilingTree
    task: Task
    node: Node
    collected: list[str] = field(default_factory=list)
    profile: Collected | None = None
    passes: int = 0
    seconds: float = 0.0
    path: list[Step] = field(default_factory=list)

    def missing(self) -> tuple[str, ...]:
        """The current node's groups not collected yet."""
        return tuple(g for g in self.node.groups if g not in self.collected)

    def take(self, got: Collected, groups: Iterable[str]) -> None:
        """Account for one collection (its cost and profile) of ``groups``."""
        self.passes += int(got.passes or 0)
        self.seconds += float(got.seconds or 0.0)
        self.profile = got if self.profile is None else self.profile.merge(got)
        self.collected += list(groups)

    def step(self) -> Route | None:
        """Decide at the current node (its groups collected): the Route at a leaf, else move down."""
        node = self.node
        if isinstance(node, Leaf):
            log.debug("routed %s to %s", self.task.id, node.id)
            return Route(node.id, tuple(self.path), tuple(self.collected), node.groups, self.profile,
                         self.passes, self.seconds)  # fmt: skip
        try:
            value = _feature_value(node, None if self.profile is None else self.profile.metrics)
        except RouteError as e:
            raise RouteError(f"{e} (task {self.task.id!r}, groups collected: {self.collected})") from None
        went = "left" if value <= node.threshold else "right"
        self.path.append(Step(node.id, node.feature, value, node.threshold, went))
        self.node = self.tree._index[node.left if went == "left" else node.right]
        return None


def _collect_batch(profiler: TreeProfiler, tasks: list[Task], groups: tuple[str, ...]) -> list:
    """One profile (or the exception) per task, by ``collect_many`` when the profiler batches."""
    if isinstance(profiler, BatchProfiler) and len(tasks) > 1:
        try:
            return list(profiler.collect_many(tasks, list(groups)))
        except Exception as exc:  # one bad task fails the batch: retry one at a time to isolate it
            log.warning(
                "batch collection of %s for %d tasks failed (%s); one task at a time", groups, len(tasks), exc
            )
    out: list = []
    for task in tasks:
        try:
            out.append(profiler.collect(task, list(groups)))
        except Exception as exc:  # failures are data: the caller decides what stops a run
            out.append(exc)
    return out


def _node_to_dict(n: Node) -> dict:
    if isinstance(n, Split):
        return {
            "id": n.id,
            "type": "split",
            "feature": n.feature,
            "threshold": n.threshold,
            "groups": list(n.groups),
            "children": {"left": n.left, "right": n.right},
        }
    d = {"id": n.id, "type": "leaf", "groups": list(n.groups)}
    if n.label:
        d["label"] = n.label
    return d


def _node_from_dict(d: dict) -> Node:
    if d["type"] == "split":
        children = d["children"]
        return Split(
            d["id"],
            d["feature"],
            float(d["threshold"]),
            tuple(d["groups"]),
            children["left"],
            children["right"],
        )
    return Leaf(d["id"], tuple(d["groups"]), d.get("label", ""))


def _feature_value(node: Split, metrics: Mapping[str, Any]) -> float:
    if metrics is None or node.feature not in metrics:
        raise RouteError(
            f"node {node.id!r} routes on {node.feature!r}, but the profile has no such metric "
            f"(the node declares groups {list(node.groups)})"
        )
    try:
        value = float(metrics[node.feature])
    except (TypeError, ValueError):
        raise RouteError(
            f"node {node.id!r}: metric {node.feature!r} is {metrics[node.feature]!r}, not a number"
        ) from None
    if math.isnan(value):
        raise RouteError(f"node {node.id!r}: metric {node.feature!r} is NaN in the profile; cannot route")
    return value


def _as_groups(groups: Iterable[str], what: str) -> tuple[str, ...]:
    if isinstance(groups, str):
        raise TreeError([f"{what}: expected a list of group names, got the string {groups!r}"])
    return tuple(groups)



# --- load / save ------------------------------------------------------------------------------------------
def load_tree(tree: str | Path | Mapping, catalog: Catalog | None = None) -> ProfilingTree:
    """Load and validate a tree from a JSON file path or an already-parsed dict.

    Args:
        tree: a path to a ``.json`` file, or the JSON form as a dict.
        catalog: optional group name -> ``MetricGroup`` (``autoprofiler.profiling.GROUPS``): also check
            that every vocabulary group exists there, with the tree's source and the listed features.
    Returns:
        the :class:`ProfilingTree`.
    Raises:
        TreeError: every problem found, each naming its JSON path (e.g.
            ``nodes[3].children.right: node 'n9' does not exist``). FileNotFoundError: no such file.

    Example: ``load_tree("trees/seed.json", catalog=GROUPS).apply(profile)``.
    """
    origin = ""
    if not isinstance(tree, Mapping):
        origin = str(tree)
        text = Path(tree).read_text()
        try:
            tree = json.loads(text)
        except json.JSONDecodeError as e:
            raise TreeError([f"(file): not valid JSON: {e}"], origin) from None
    return ProfilingTree.from_dict(tree, catalog, origin)


def save_tree(tree: ProfilingTree, path: str | Path) -> Path:
    """Write ``tree.to_json()`` to ``path`` (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tree.to_json())
    return path

