"""Proposals for editing one leaf of the incumbent tree: what a proposer sees and what it answers.

A proposer gets a ``LeafContext`` (the leaf, the selection tasks routed to it, their routing metrics and
their rewards observed so far; by construction nothing of the acceptance tasks) and returns
``Candidate`` edits for one phase:

- **REWRITE**: groups to add to the leaf;
- **SPLIT**: a (feature, threshold) pair and the groups each new leaf shows.

Two proposers: ``StatisticalProposer`` ranks edits by the rewards already observed (no LLM);
``LLMProposer`` asks a chat model and validates its JSON answer. A proposal that cannot be used (bad
JSON, an unknown group or feature) is a candidate with ``invalid`` set: logged, rejected, never
evaluated.

Example:
    >>> Candidate("REWRITE", "all", add_groups=("memory",)).describe()
    'REWRITE all += memory'
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from autoprofiler import rewards
from autoprofiler.learning.config import LearnConfig
from autoprofiler.tasks import Task
from autoprofiler.tree import GroupSpec, ProfilingTree

if TYPE_CHECKING:
    from autoprofiler.llm import ChatClient
    from autoprofiler.profiling.groups import MetricGroup

__all__ = [
    "OPERATORS",
    "PROPOSERS",
    "Candidate",
    "LLMProposer",
    "LeafContext",
    "Proposer",
    "StatisticalProposer",
]

#: The two edit operators, in the order the learner tries them on a leaf.
OPERATORS = ("REWRITE", "SPLIT")


@dataclass
class Candidate:
    """One proposed edit of the incumbent tree.

    REWRITE: ``add_groups`` to ``leaf``. SPLIT: ``leaf`` becomes ``feature <= threshold`` with new leaves
    showing ``left_groups`` / ``right_groups``. ``invalid`` holds why a proposal could not be used (bad
    JSON, unknown group, ...): such a candidate is logged as rejected without any evaluation.
    """

    operator: str
    leaf: str
    add_groups: tuple[str, ...] = ()
    feature: str | None = None
    threshold: float | None = None
    left_groups: tuple[str, ...] | None = None
    right_groups: tuple[str, ...] | None = None
    proposer: str = ""
    score: float | None = None
    rationale: str = ""
    invalid: str = ""

    def apply(self, tree: ProfilingTree, catalog: Mapping[str, MetricGroup] | None = None) -> ProfilingTree:
        """The candidate tree (the incumbent is not changed). Raises TreeError (budget, unknown names)."""
        if self.operator == "REWRITE":
            return tree.rewrite_leaf(self.leaf, self.add_groups, catalog=catalog)
        if self.operator == "SPLIT":
            return tree.split_leaf(
                self.leaf,
                self.feature,
                self.threshold,
                left_groups=self.left_groups,
                right_groups=self.right_groups,
                catalog=catalog,
            )
        raise ValueError(f"operator: expected one of {OPERATORS}, got {self.operator!r}")

    def describe(self) -> str:
        if self.operator == "REWRITE":
            return f"REWRITE {self.leaf} += {', '.join(self.add_groups) or '(nothing)'}"
        return (
            f"SPLIT {self.leaf} on {self.feature} <= {self.threshold}: "
            f"left [{', '.join(self.left_groups or ())}] right [{', '.join(self.right_groups or ())}]"
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("add_groups", "left_groups", "right_groups"):
            d[k] = None if d[k] is None else list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Candidate:
        d = dict(d)
        for k in ("add_groups", "left_groups", "right_groups"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        d["add_groups"] = d.get("add_groups") or ()
        return cls(**d)


@dataclass(frozen=True)
class LeafContext:
    """What a proposer sees about one leaf: data of the selection tasks routed to it, and nothing else.

    Attributes:
        tree: the incumbent. leaf / groups: the leaf and what it shows.
        tasks: the selection (proposal) tasks routed to the leaf: never an acceptance task while
            ``selection_fraction > 0`` (the learner builds contexts from ``Learner.proposal_tasks_``).
        metrics: task hash -> routing metrics (all groups), for ``tasks`` only.
        rewards: (task hash, configuration name) -> mean reward of every cell observed so far, for
            ``tasks`` only.
        configurations: name -> groups of the probe configurations (observed on every training task).
        features: features a split may route on (in the tree vocabulary or the catalog, finite for every
            task of the leaf).
        groups_allowed: group names REWRITE/SPLIT may use.

    The separation is structural, not a convention: ``metrics`` and ``rewards`` are read-only copies
    and construction refuses an entry of a task outside ``tasks`` (``ValueError``), so a context cannot
    carry an acceptance task's reward, nor a handle on the learner's memo to read or write one through.
    ``LeafContext.of`` builds one by keeping only the tasks' entries (and a copy of the config).
    """

    tree: ProfilingTree
    leaf: str
    groups: tuple[str, ...]
    tasks: tuple[Task, ...]
    metrics: Mapping[str, Mapping[str, float]]
    rewards: Mapping[tuple[str, str], float]
    configurations: Mapping[str, tuple[str, ...]]
    features: tuple[str, ...]
    groups_allowed: tuple[str, ...]
    config: LearnConfig

    def __post_init__(self):
        hashes = {t.hash for t in self.tasks}
        outside = sorted((set(self.metrics) | {h for h, _ in self.rewards}) - hashes)
        if outside:
            raise ValueError(
                f"LeafContext: metrics or rewards of {len(outside)} task(s) outside its tasks "
                f"(first: {outside[0]}); a proposer sees only the selection tasks of its leaf"
            )
        freeze = object.__setattr__  # frozen dataclass: store read-only copies once, at construction
        freeze(self, "tasks", tuple(self.tasks))
        metrics = {h: MappingProxyType(dict(m)) for h, m in self.metrics.items()}
        freeze(self, "metrics", MappingProxyType(metrics))
        freeze(self, "rewards", MappingProxyType(dict(self.rewards)))
        configurations = {k: tuple(v) for k, v in self.configurations.items()}
        freeze(self, "configurations", MappingProxyType(configurations))
        freeze(self, "features", tuple(self.features))
        freeze(self, "groups_allowed", tuple(self.groups_allowed))

    @classmethod
    def of(
        cls,
        tree: ProfilingTree,
        leaf: str,
        tasks: Iterable[Task],
        metrics: Mapping[str, Mapping[str, float]],
        rewards: Mapping[tuple[str, str], float],
        configurations: Mapping[str, Iterable[str]],
        features: Iterable[str],
        groups_allowed: Iterable[str],
        config: LearnConfig,
    ) -> LeafContext:
        """The context of ``leaf`` holding only ``tasks``' entries of ``metrics`` and ``rewards``."""
        tasks = tuple(tasks)
        hashes = {t.hash for t in tasks}
        return cls(
            tree,
            leaf,
            tree.leaf(leaf).groups,
            tasks,
            {h: metrics[h] for h in hashes},
            {key: r for key, r in rewards.items() if key[0] in hashes},
            {k: tuple(v) for k, v in configurations.items()},
            tuple(features),
            tuple(groups_allowed),
            dataclasses.replace(config),  # a copy: a proposer cannot change the acceptance test's settings
        )

    @property
    def incumbent(self) -> str:
        return rewards.configuration_name(self.groups)

    def reward(self, task: Task, configuration: str) -> float | None:
        return self.rewards.get((task.hash, configuration))

    def table(self) -> dict[str, dict[str, float]]:
        """configuration -> {task hash: reward} over the leaf's tasks (probe configurations + incumbent)."""
        names = {rewards.configuration_name(g) for g in self.configurations.values()} | {self.incumbent}
        return {
            c: {t.hash: self.rewards[(t.hash, c)] for t in self.tasks if (t.hash, c) in self.rewards}
            for c in sorted(names)
        }


class Proposer(Protocol):
    """What the learner needs of a proposer: a name for the log and candidates for one (leaf, phase)."""

    name: str

    def propose(self, phase: str, ctx: LeafContext) -> list[Candidate]: ...


class StatisticalProposer:
    """Proposals from the rewards already observed (no LLM).

    REWRITE: each probe configuration C gives the candidate "add C minus the leaf's groups", and each
    single group g gives "add g"; they are ranked by the mean observed gain of C (for g: the best C that
    contains g) over the leaf's incumbent on the leaf's tasks. Additions the tree's
    ``max_groups_per_leaf`` leaves no room for are not proposed (the tree would refuse them).

    SPLIT: for each feature and each threshold at ``split_quantiles`` of the leaf's tasks' values, each
    side takes the configuration with the highest total observed reward on it; the split is scored by how
    much per-side best configurations beat the best single configuration for the whole leaf (divided by
    the leaf's task count). Splits whose sides want the same configuration score 0 and are not proposed.
    """

    name = "statistical"

    def propose(self, phase: str, ctx: LeafContext) -> list[Candidate]:
        return self._rewrites(ctx) if phase == "REWRITE" else self._splits(ctx)

    def _rewrites(self, ctx: LeafContext) -> list[Candidate]:
        table = ctx.table()
        base = table.get(ctx.incumbent, {})
        gains: dict[str, float] = {}
        for c, col in table.items():
            common = [h for h in col if h in base]
            if common and c != ctx.incumbent:
                gains[c] = sum(col[h] - base[h] for h in common) / len(common)
        cap = ctx.tree.budget.max_groups_per_leaf
        room = math.inf if cap is None else cap - len(ctx.groups)
        scored: dict[tuple[str, ...], float] = {}
        for c, gain in gains.items():
            add = tuple(g for g in c.split("+") if g and g not in ctx.groups)
            if not add or not all(g in ctx.groups_allowed for g in add):
                continue
            fitting = ([add] if len(add) <= room else []) + ([(g,) for g in add] if room >= 1 else [])
            for a in fitting:
                scored[a] = max(scored.get(a, -math.inf), gain)
        ranked = sorted(scored.items(), key=lambda kv: (-kv[1], len(kv[0]), kv[0]))
        return [
            Candidate(
                "REWRITE",
                ctx.leaf,
                add_groups=add,
                proposer=self.name,
                score=round(s, 6),
                rationale=f"observed mean gain {s:+.4f} of configurations with {'+'.join(add)}",
            )
            for add, s in ranked
        ]

    def _splits(self, ctx: LeafContext) -> list[Candidate]:
        table = ctx.table()
        hashes = [t.hash for t in ctx.tasks]
        configs = [c for c, col in table.items() if all(h in col for h in hashes)]
        if not configs:
            return []

        def best(side: list[str]) -> tuple[str, float]:
            return max(((c, sum(table[c][h] for h in side)) for c in configs), key=lambda cv: (cv[1], cv[0]))

        _, whole = best(hashes)
        n, k = len(hashes), max(1, ctx.config.min_leaf_tasks)
        out: list[Candidate] = []
        for feature in ctx.features:
            values = sorted((ctx.metrics[h][feature], h) for h in hashes)
            thresholds = set()
            for q in ctx.config.split_quantiles:
                i = min(max(round(q * n), k), n - k)  # tasks on the left
                if 0 < i < n and values[i - 1][0] < values[i][0]:
                    thresholds.add((values[i - 1][0] + values[i][0]) / 2.0)
            for thr in sorted(thresholds):
                left = [h for v, h in values if v <= thr]
                right = [h for v, h in values if v > thr]
                (cl, sl), (cr, sr) = best(left), best(right)
                score = (sl + sr - whole) / n
                if cl == cr or score <= 0:
                    continue
                out.append(
                    Candidate(
                        "SPLIT",
                        ctx.leaf,
                        feature=feature,
                        threshold=float(thr),
                        left_groups=tuple(g for g in cl.split("+") if g),
                        right_groups=tuple(g for g in cr.split("+") if g),
                        proposer=self.name,
                        score=round(score, 6),
                        rationale=f"{len(left)} tasks <= threshold do best with {cl or '(none)'}, "
                        f"{len(right)} above with {cr or '(none)'}; "
                        f"observed gain {score:+.4f} per task over one configuration",
                    )
                )
        out.sort(key=lambda c: (-c.score, c.feature, c.threshold))
        return out


class LLMProposer:
    """Proposals from an LLM (``autoprofiler.llm.ChatClient``), validated before use.

    The prompt shows the leaf (its groups), the groups it may add (with their features and passes), the
    budget, and for each of the leaf's tasks (at most ``max_tasks_shown``) the values of the splittable
    features with the largest spread and the observed reward of each probe configuration. It asks for
    JSON: ``{"proposals": [{"operator": "REWRITE", "add_groups": [...], "rationale": "..."}]}`` or, for
    SPLIT, ``{"operator": "SPLIT", "feature": ..., "threshold": ..., "left_groups": [...],
    "right_groups": [...]}``. An answer that is not JSON, or a proposal naming an unknown group or
    feature, becomes a candidate with ``invalid`` set (logged, rejected, never evaluated).
    """

    name = "llm"

    def __init__(
        self,
        client: ChatClient | None,
        max_tasks_shown: int = 16,
        max_features_shown: int = 8,
        max_proposals: int = 3,
        temperature: float = 0.0,
        seed: int | None = 0,
    ):
        self.client = client
        self.max_tasks_shown = max_tasks_shown
        self.max_features_shown = max_features_shown
        self.max_proposals = max_proposals
        self.temperature = temperature
        self.seed = seed
        self.calls = 0

    def messages(self, phase: str, ctx: LeafContext) -> list[dict[str, str]]:
        """The chat messages for one (leaf, phase) proposal request."""
        vocab = ctx.tree.vocabulary
        spread = []
        for f in ctx.features:
            vals = [ctx.metrics[t.hash][f] for t in ctx.tasks]
            lo, hi = min(vals), max(vals)
            spread.append((0.0 if hi == lo else (hi - lo) / (abs(hi) + abs(lo) + 1e-12), f))
        shown_features = [f for _, f in sorted(spread, reverse=True)[: self.max_features_shown]]
        table = ctx.table()
        lines = []
        for t in ctx.tasks[: self.max_tasks_shown]:
            feats = ", ".join(f"{f}={ctx.metrics[t.hash][f]:.4g}" for f in shown_features)
            rws = ", ".join(f"{c or '(none)'}={table[c][t.hash]:.3f}" for c in table if t.hash in table[c])
            lines.append(f"- {t.id}: {feats}\n  rewards: {rws}")
        groups = "\n".join(_describe_group(g, vocab) for g in ctx.groups_allowed)
        b = ctx.tree.budget
        op = (
            (
                "REWRITE: add metric groups to this leaf. Each proposal: "
                '{"operator": "REWRITE", "add_groups": ["group", ...], "rationale": "..."}'
            )
            if phase == "REWRITE"
            else (
                "SPLIT: split this leaf on a feature threshold so tasks that need different groups separate. "
                'Each proposal: {"operator": "SPLIT", "feature": "<feature>", "threshold": <number>, '
                '"left_groups": [...], "right_groups": [...], "rationale": "..."}; tasks with '
                "feature <= threshold go left."
            )
        )
        system = (
            "You design profiling trees: each leaf names the Nsight Compute metric groups shown to a kernel "
            "optimizer. Rewards are log speedups of the optimized kernel (0 when wrong or slower). "
            "Answer with one JSON object and nothing else."
        )
        user = (
            f"Leaf {ctx.leaf!r} currently shows: {', '.join(ctx.groups) or '(nothing)'}.\n"
            f"Budget: max_depth={b.max_depth}, max_groups_per_leaf={b.max_groups_per_leaf}, "
            f"max_passes_per_task={b.max_passes_per_task}.\n"
            f"Groups available:\n{groups}\n"
            f"Features a split may use: {', '.join(ctx.features[:40])}\n"
            f"Tasks routed to this leaf ({len(ctx.tasks)}), with observed rewards per configuration:\n"
            + "\n".join(lines)
            + f"\n\nPropose up to {self.max_proposals} edits of this kind: {op}\n"
            'Answer: {"proposals": [...]}'
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def propose(self, phase: str, ctx: LeafContext) -> list[Candidate]:
        """Candidates for one (leaf, phase); a failed LLM call is one invalid candidate, not a crash."""
        if self.client is None:
            raise ValueError("LLMProposer.propose needs a client (ChatClient); got None")
        try:
            reply = self.client.chat(self.messages(phase, ctx), temperature=self.temperature, seed=self.seed)
        except Exception as e:  # LLMError and friends: a rejected proposal, logged, not a crash
            return [
                Candidate(
                    phase, ctx.leaf, proposer=self.name, invalid=f"LLM call failed: {type(e).__name__}: {e}"
                )
            ]
        self.calls += 0 if reply.cached else 1
        return self.parse(reply.text, phase, ctx)

    def parse(self, text: str, phase: str, ctx: LeafContext) -> list[Candidate]:
        """Validated candidates from an answer; invalid ones carry the reason in ``invalid``."""

        def bad(reason: str, raw: Any = None) -> Candidate:
            return Candidate(
                phase,
                ctx.leaf,
                proposer=self.name,
                invalid=reason,
                rationale=json.dumps(raw)[:500] if raw is not None else text[:500],
            )

        body = text.strip()
        fence = re.search(r"```(?:json)?\s*\n(.*?)```", body, re.DOTALL)
        if fence:
            body = fence.group(1)
        start, end = body.find("{"), body.rfind("}")
        try:
            data = json.loads(body[start : end + 1]) if start >= 0 and end > start else json.loads(body)
        except json.JSONDecodeError as e:
            return [bad(f"bad JSON: {e.msg} at char {e.pos}")]
        proposals = data.get("proposals") if isinstance(data, dict) else None
        if not isinstance(proposals, list):
            return [bad(f"expected an object with a 'proposals' list, got {type(data).__name__}")]
        out = []
        allowed = set(ctx.groups_allowed)
        for p in proposals[: self.max_proposals]:
            if not isinstance(p, dict):
                out.append(bad(f"a proposal must be an object, got {type(p).__name__}", p))
                continue
            op = p.get("operator")
            if op != phase:
                out.append(bad(f"operator: expected {phase!r} in this phase, got {op!r}", p))
                continue
            lists = {
                k: p.get(k) for k in (("add_groups",) if op == "REWRITE" else ("left_groups", "right_groups"))
            }
            problem = ""
            for k, v in lists.items():
                if not isinstance(v, list) or not all(isinstance(g, str) for g in v):
                    problem = f"{k}: expected a list of group names, got {v!r}"
                elif set(v) - allowed:
                    problem = f"{k}: unknown group(s) {sorted(set(v) - allowed)} (allowed: {sorted(allowed)})"
            if op == "SPLIT" and not problem:
                thr = p.get("threshold")
                if p.get("feature") not in ctx.features:
                    problem = f"feature: {p.get('feature')!r} is not a splittable feature of this leaf"
                elif not isinstance(thr, int | float) or isinstance(thr, bool) or not math.isfinite(thr):
                    problem = f"threshold: expected a finite number, got {thr!r}"
            if problem:
                out.append(bad(problem, p))
                continue
            rationale = str(p.get("rationale", ""))[:500]
            if op == "REWRITE":
                out.append(
                    Candidate(
                        "REWRITE",
                        ctx.leaf,
                        add_groups=tuple(lists["add_groups"]),
                        proposer=self.name,
                        rationale=rationale,
                    )
                )
            else:
                out.append(
                    Candidate(
                        "SPLIT",
                        ctx.leaf,
                        feature=p["feature"],
                        threshold=float(p["threshold"]),
                        left_groups=tuple(lists["left_groups"]),
                        right_groups=tuple(lists["right_groups"]),
                        proposer=self.name,
                        rationale=rationale,
                    )
                )
        return out or [bad("no proposals in the answer")]


def _describe_group(name: str, vocabulary: Mapping[str, GroupSpec]) -> str:
    """One prompt line for a group: its passes and first features (unknown outside the vocabulary)."""
    spec = vocabulary.get(name)
    passes = None if spec is None else spec.passes
    features = () if spec is None else list(spec.features)[:6]
    return f"- {name}: passes={passes}; features: {', '.join(features)}"


#: Proposer names (``workflows/train.py``'s ``proposer`` key) and their classes.
PROPOSERS = {"statistical": StatisticalProposer, "llm": LLMProposer}
