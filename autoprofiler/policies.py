"""Profiling policies: anything that picks, per task, which metric groups to collect and show.

One interface, ``policy.select(task, profiler) -> Selection``; ``policy.name`` names it in reward tables.

- :class:`Blind`: collects nothing; the rewriter sees no profile.
- :class:`Random`: seeded per task (deterministic given the seed and the task's content hash); draws
  groups within the tree's budget (groups per leaf, passes per task).
- :class:`Static`: one fixed configuration (a name from ``CONFIGURATIONS`` or explicit groups).
- :class:`Oracle`: analysis only: needs every configuration's recorded outcome for the task and picks
  the best one.
- :class:`TreePolicy`: routes the task through a :class:`~autoprofiler.tree.ProfilingTree`.

Example::

    >>> class Nothing:                       # a profiler is never called by Blind
    ...     def collect(self, task, groups): raise AssertionError
    >>> Blind().select(task=None, profiler=Nothing())
    Selection(groups=(), profile=None, passes=0, seconds=0.0, trace=(), leaf=None)
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autoprofiler.rewards import configuration_name
from autoprofiler.tree import ProfilingTree

__all__ = ["Blind", "Oracle", "Policy", "Random", "Selection", "Static", "TreePolicy", "held_out_policies"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Selection:
    """What a policy chose for one task, and what it cost.

    Attributes:
        groups: the groups shown to the rewriter (a tree leaf's; a static configuration's).
        profile: everything collected (routing groups and the shown ones), ``None`` when nothing was;
            call :meth:`shown_profile` before handing it to a rewriter.
        passes: replay passes actually spent collecting.
        seconds: wall seconds actually spent collecting (as the profiler reports).
        trace: how the choice was made: a tree's path of ``Step(node, feature, value, threshold, went)``;
            ``(("configuration", name),)`` for Static; ``((configuration, reward), ...)`` for Oracle.
        leaf: the leaf id (TreePolicy only).
    """

    groups: tuple[str, ...]
    profile: Any
    passes: int = 0
    seconds: float = 0.0
    trace: tuple = ()
    leaf: str | None = None

    @property
    def configuration(self) -> str:
        """Canonical configuration name of ``groups`` (sorted, ``+``-joined; ``""`` for none)."""
        return configuration_name(self.groups)

    def shown_profile(self) -> Any:
        """The profile restricted to ``groups`` (what the rewriter may see), or ``None``."""
        if self.profile is None or not self.groups:
            return None
        return self.profile.restrict(self.groups)


class Policy:
    """Base class: ``name`` (used in reward tables) and ``select(task, profiler) -> Selection``."""

    name: str = "policy"

    def select(self, task: Any, profiler: Any) -> Selection:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _collect(task: Any, profiler: Any, groups: tuple[str, ...], trace: tuple = (), leaf=None) -> Selection:
    if not groups:
        return Selection((), None, 0, 0.0, trace, leaf)
    profile = profiler.collect(task, list(groups))
    return Selection(groups, profile, int(profile.passes or 0), float(profile.seconds or 0.0), trace, leaf)


def _default_configurations() -> Mapping[str, tuple[str, ...]]:
    from autoprofiler.profiling.groups import CONFIGURATIONS  # lazy: tests may pass their own

    return CONFIGURATIONS


class Blind(Policy):
    """Collect nothing; the rewriter gets no profile (the 'no profiling' baseline)."""

    name = "blind"

    def select(self, task: Any, profiler: Any) -> Selection:
        return Selection((), None)


class Static(Policy):
    """Always the same configuration.

    Args:
        configuration: a configuration name (a key of ``configurations``, e.g. ``"memory"``), or an
            explicit sequence of group names.
        configurations: name -> groups; default ``autoprofiler.profiling.groups.CONFIGURATIONS``.

    Raises:
        ValueError: an unknown configuration name.

    Example: ``Static("memory").select(task, profiler).groups``.
    """

    def __init__(
        self, configuration: str | Sequence[str], configurations: Mapping[str, Sequence[str]] | None = None
    ):
        if isinstance(configuration, str):
            configurations = _default_configurations() if configurations is None else configurations
            if configuration not in configurations:
                raise ValueError(
                    f"Static: unknown configuration {configuration!r}; "
                    f"expected one of {sorted(configurations)} "
                    "or a list of group names"
                )
            self.groups = tuple(configurations[configuration])
            self.name = f"static:{configuration}"
        else:
            self.groups = tuple(dict.fromkeys(configuration))
            self.name = f"static:{configuration_name(self.groups) or 'none'}"
        self.configuration = (
            configuration if isinstance(configuration, str) else configuration_name(self.groups)
        )

    def select(self, task: Any, profiler: Any) -> Selection:
        return _collect(task, profiler, self.groups, trace=(("configuration", self.configuration),))


class Random(Policy):
    """Random groups, seeded per task, within a budget.

    For each task a generator seeded by ``sha256(f"{seed}:{task.hash}")`` draws a count ``k`` uniformly
    in ``[1, max_groups]``, shuffles ``pool`` and takes groups in that order while the count is below
    ``k`` and the summed ``passes`` stay within ``max_passes`` (groups of unknown cost count 0). The same
    (seed, task) always gives the same groups, whatever the order tasks come in.

    "Same budget" as a tree: use :meth:`like`, which takes the tree's vocabulary as the pool and its
    ``max_groups_per_leaf`` / ``max_passes_per_task`` (a random policy spends no passes on routing, so
    it may spend all of ``max_passes_per_task`` on the groups it shows).

    Example: ``Random.like(tree, seed=1).select(task, profiler).groups``.
    """

    def __init__(
        self,
        pool: Iterable[str],
        max_groups: int,
        max_passes: int | None = None,
        passes: Mapping[str, int | None] | None = None,
        seed: int = 0,
    ):
        self.pool = tuple(dict.fromkeys(pool))
        if not self.pool:
            raise ValueError("Random: pool must name at least one group, got none")
        if not isinstance(max_groups, int) or max_groups < 1:
            raise ValueError(f"Random: max_groups must be a positive integer, got {max_groups!r}")
        self.max_groups = max_groups
        self.max_passes = max_passes
        self.passes = dict(passes or {})
        self.seed = int(seed)
        self.name = f"random:{self.seed}"

    @classmethod
    def like(cls, tree: ProfilingTree, seed: int = 0, pool: Iterable[str] | None = None) -> Random:
        """A random policy with ``tree``'s budget; the pool defaults to the tree's vocabulary."""
        max_groups = (
            tree.budget.max_groups_per_leaf or max(len(tree.leaf(i).groups) for i in tree.leaf_ids) or 1
        )
        pool = tuple(tree.vocabulary) if pool is None else tuple(pool)
        passes = {g: s.passes for g, s in tree.vocabulary.items()}
        return cls(pool, max_groups, tree.budget.max_passes_per_task, passes, seed)

    def draw(self, task: Any) -> tuple[str, ...]:
        """The groups for ``task`` (deterministic given ``seed`` and ``task.hash``)."""
        digest = hashlib.sha256(f"{self.seed}:{task.hash}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        k = rng.randint(1, min(self.max_groups, len(self.pool)))
        order = list(self.pool)
        rng.shuffle(order)
        chosen, cost = [], 0
        for g in order:
            if len(chosen) == k:
                break
            c = self.passes.get(g) or 0
            if self.max_passes is not None and cost + c > self.max_passes:
                continue
            chosen.append(g)
            cost += c
        return tuple(chosen)

    def select(self, task: Any, profiler: Any) -> Selection:
        return _collect(task, profiler, self.draw(task))


class Oracle(Policy):
    """Analysis only: per task, the configuration with the best recorded reward.

    ``is_oracle`` tells ``analysis.evaluate_policies`` to score it from every configuration's outcome.

    Args:
        configurations: name -> groups (e.g. the four fixed ones).
        outcomes: the recorded reward of (task, configuration name): a callable ``f(task, name) ->
            float``, or a mapping keyed by ``(task.hash, name)`` or ``(task.id, name)``.
        name: the policy name (default ``"oracle"``).

    Ties go to the configuration listed first. The chosen configuration's groups are collected (so a
    rewriter can be shown them); ``trace`` lists every (configuration, reward) seen.

    Raises (from ``select``):
        KeyError: a configuration's outcome for the task is not recorded.

    Example: ``Oracle(CONFIGURATIONS, {(t.hash, "memory"): 0.4, (t.hash, "compute"): 0.1, ...})``.
    """

    is_oracle = True

    def __init__(
        self,
        configurations: Mapping[str, Sequence[str]],
        outcomes: Callable[[Any, str], float] | Mapping[tuple[str, str], float],
        name: str = "oracle",
    ):
        if not configurations:
            raise ValueError("Oracle: configurations must not be empty")
        self.configurations = {k: tuple(v) for k, v in configurations.items()}
        self.outcomes = outcomes
        self.name = name

    def outcome(self, task: Any, configuration: str) -> float:
        if callable(self.outcomes):
            return float(self.outcomes(task, configuration))
        for key in ((task.hash, configuration), (task.id, configuration)):
            if key in self.outcomes:
                return float(self.outcomes[key])
        raise KeyError(
            f"Oracle: no recorded outcome for task {task.id!r} (hash {task.hash}) with configuration "
            f"{configuration!r}; the oracle needs every configuration's outcome"
        )

    def select(self, task: Any, profiler: Any) -> Selection:
        scored = tuple((name, self.outcome(task, name)) for name in self.configurations)
        best = max(scored, key=lambda s: s[1])[0]  # max keeps the first of equal rewards
        return _collect(task, profiler, self.configurations[best], trace=scored)


class TreePolicy(Policy):
    """Route each task through a profiling tree; show the leaf's groups.

    ``name`` defaults to ``"tree:<provenance name or 'tree'>@<fingerprint>"`` so two different trees
    never share a name in a reward table.

    Example: ``TreePolicy(load_tree("trees/seed.json")).select(task, profiler).leaf``.
    """

    def __init__(self, tree: ProfilingTree, name: str | None = None):
        self.tree = tree
        label = str(tree.provenance.get("name", "tree"))
        self.name = name or f"tree:{label}@{tree.fingerprint()}"

    def select_many(self, tasks: Iterable[Any], profiler: Any) -> list[Selection | Exception]:
        """:meth:`select` for many tasks with batched collection (``ProfilingTree.route_many``);
        a task whose profiling or routing failed gets the exception instead of a Selection."""
        return [
            r if isinstance(r, Exception) else _from_route(r) for r in self.tree.route_many(tasks, profiler)
        ]

    def select(self, task: Any, profiler: Any) -> Selection:
        return _from_route(self.tree.route(task, profiler))


def _from_route(route: Any) -> Selection:
    return Selection(route.leaf_groups, route.profile, route.passes, route.seconds, route.path, route.leaf)


def held_out_policies(
    seed_tree: ProfilingTree, tree: ProfilingTree, probes: Sequence[str], groups: Iterable[str]
) -> dict[str, Any]:
    """What ``workflows/train.py`` judges on the held-out split, by name: blind, each probed static
    configuration, random (drawn like ``tree`` from ``groups``), the seed tree, the learned tree, and
    the oracle over ``probes`` (``analysis.evaluate_policies`` takes the oracle as that list)."""
    return {
        "blind": Blind(),
        **{f"static:{n}": Static(n) for n in probes},
        "random": Random.like(tree, seed=0, pool=groups),
        "seed_tree": TreePolicy(seed_tree, "seed_tree"),
        "learned_tree": TreePolicy(tree, "learned_tree"),
        "oracle": probes,
    }
