"""Learning a profiling tree: REWRITE/SPLIT proposals accepted by a paired test (the paper's loop).

For each leaf of the incumbent tree (breadth first), REWRITE candidates (groups to add to the leaf) are
tried first, then SPLIT candidates (feature, threshold, and the groups each new leaf shows). Each
candidate tree is compared with the incumbent on the training tasks, paired: only the tasks routed to the
changed leaf can change (every other paired difference is exactly zero by construction), so only those
are evaluated. A candidate is accepted when a one-sided lower confidence bound of the mean paired reward
gain over the affected tasks exceeds ``margin`` (and at least ``min_tasks`` tasks are affected).

After every decision the learner checkpoints: the incumbent tree (``tree.json``), one JSON line per
proposal in ``proposals.jsonl`` (statistics, accepted or why not, evaluations spent against a naive full
re-evaluation) and its loop state (``state.json``), so ``fit(..., resume=True)`` continues from the last
decision.

Example (replay, no GPU, no LLM)::

    env = ReplayEnvironment.from_dir("datasets/h200_suite", rewriter=RuleRewriter())
    learner = Learner(env, train_tasks, StatisticalProposer(), LearnConfig(confidence=0.9), out_dir="runs/x")
    tree = learner.fit(load_tree("trees/seed.json"))
    learner.summary()["evaluations"]        # {"spent": 212, "naive": 1480, ...}
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoprofiler import rewards
from autoprofiler.tasks import Task
from autoprofiler.tree import ProfilingTree, TreeError, load_tree, save_tree

__all__ = [
    "Candidate",
    "Decision",
    "LLMProposer",
    "LearnConfig",
    "Learner",
    "LeafContext",
    "PairedTest",
    "StatisticalProposer",
    "paired_test",
]

logger = logging.getLogger(__name__)

OPERATORS = ("REWRITE", "SPLIT")
METHODS = ("t", "bootstrap")


def _unit(text: str) -> float:
    """A number in [0, 1) fixed by ``text`` (used to assign tasks to proposal / test subsets)."""
    return int(hashlib.sha256(("selection:" + text).encode()).hexdigest()[:12], 16) / float(16**12)


# --- the acceptance test -----------------------------------------------------------------------------
@dataclass(frozen=True)
class PairedTest:
    """The outcome of one paired test on per-task reward gains (candidate minus incumbent).

    ``lcb`` is the one-sided lower confidence bound of the mean gain at ``confidence``; ``accepted`` is
    ``n >= min_tasks and lcb > margin``; ``reason`` says why in words.
    """

    n: int
    mean: float
    sd: float
    lcb: float
    p_value: float | None
    method: str
    confidence: float
    margin: float
    min_tasks: int
    accepted: bool
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in dataclasses.asdict(self).items()
        }


def paired_test(
    gains: Sequence[float],
    method: str = "t",
    confidence: float = 0.95,
    margin: float = 0.0,
    min_tasks: int = 3,
    bootstrap_samples: int = 2000,
    seed: int = 0,
) -> PairedTest:
    """One-sided test that the mean paired gain exceeds ``margin``.

    Args:
        gains: per-task reward differences, candidate minus incumbent (the affected tasks only).
        method: ``"t"`` (Student t lower bound: mean - t_{c,n-1} * sd / sqrt(n)) or ``"bootstrap"``
            (the (1 - confidence) percentile of ``bootstrap_samples`` resampled means, fixed ``seed``).
        confidence: e.g. 0.95 for a 5% false-accept level under the null of no gain.
        margin: the LCB must exceed this (reward units; 0 means "better at all").
        min_tasks: fewer affected tasks than this is a rejection, whatever the numbers.

    Measured false-accept rates at confidence 0.9 under a zero-inflated null (tests/test_learning.py):
    t 0.103 / 0.096 / 0.101 at n = 6 / 20 / 60; the percentile bootstrap is anti-conservative at small n
    (0.177 / 0.107 / 0.116), so ``t`` is the default and ``bootstrap`` wants n >= 20.

    Example:
        >>> paired_test([0.4, 0.3, 0.5, 0.35, 0.45]).accepted
        True
        >>> paired_test([0.4, -0.3, 0.0, 0.1]).accepted
        False
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence: expected a number in [0.5, 1), got {confidence!r}")
    import numpy as np  # lazy: keeps module import light

    g = np.asarray(list(gains), dtype=float)
    n = int(g.size)
    mean = float(g.mean()) if n else 0.0
    sd = float(g.std(ddof=1)) if n > 1 else 0.0
    p_value: float | None = None
    if n < max(1, min_tasks) or n < 2:
        return PairedTest(
            n,
            mean,
            sd,
            -math.inf,
            None,
            method,
            confidence,
            margin,
            min_tasks,
            False,
            f"only {n} affected task(s) < min_tasks {min_tasks}",
        )
    if method == "t":
        from scipy import stats

        if sd == 0.0:
            lcb = mean
            p_value = 0.0 if mean > margin else 1.0
        else:
            se = sd / math.sqrt(n)
            lcb = mean - float(stats.t.ppf(confidence, n - 1)) * se
            p_value = float(stats.t.sf((mean - margin) / se, n - 1))
    else:
        rng = np.random.default_rng(seed)
        means = g[rng.integers(0, n, size=(bootstrap_samples, n))].mean(axis=1)
        lcb = float(np.quantile(means, 1.0 - confidence))
        p_value = float((means <= margin).mean())
    accepted = lcb > margin
    reason = (
        f"LCB {lcb:.4f} > margin {margin:.4f}"
        if accepted
        else f"LCB {lcb:.4f} <= margin {margin:.4f} (mean gain {mean:.4f} over {n} tasks)"
    )
    return PairedTest(n, mean, sd, lcb, p_value, method, confidence, margin, min_tasks, accepted, reason)


# --- configuration -----------------------------------------------------------------------------------
@dataclass
class LearnConfig:
    """Learner settings (all plain values, so a run's config is one JSON object).

    Attributes:
        method, confidence, margin, min_tasks, bootstrap_samples: the acceptance test (``paired_test``).
        max_rewrite_candidates / max_split_candidates: candidates tried per leaf and phase.
        max_rewrites_per_leaf: accepted REWRITEs on one leaf before moving on to SPLIT.
        split_quantiles: where split thresholds are placed among the leaf's tasks' feature values.
        min_leaf_tasks: each side of a split must keep at least this many training tasks.
        max_decisions: stop after this many decisions (a bound on training cost).
        seeds: evaluation seeds averaged per task (the paired unit is the task).
        bonferroni: divide the test's level by the number of candidates tried per (leaf, phase), so the
            chance of any false accept on a leaf stays at the configured level.
        selection_fraction: share of the training tasks (fixed by task hash) kept out of the proposers'
            view and used for the acceptance test. Proposers pick candidates by their observed gain, so
            testing on the same tasks accepts noise far above the configured level (see the null test);
            0 tests on the tasks the proposer saw (the paper's literal protocol).
        objective: what a paired gain is measured in (``rewards.OBJECTIVES``): ``reward`` (the paper's:
            ``max(0, log speedup)`` when correct) or ``log_speedup`` (``log`` of the effective speedup,
            unclipped: avoiding a slowdown counts, as it does in the geomean policies are judged by).
    """

    method: str = "t"
    confidence: float = 0.95
    margin: float = 0.0
    min_tasks: int = 3
    bootstrap_samples: int = 2000
    max_rewrite_candidates: int = 3
    max_split_candidates: int = 3
    max_rewrites_per_leaf: int = 1
    split_quantiles: tuple[float, ...] = (0.25, 0.5, 0.75)
    min_leaf_tasks: int = 2
    max_decisions: int = 100
    seeds: tuple[int, ...] = (0,)
    bonferroni: bool = False
    selection_fraction: float = 0.5
    objective: str = "reward"

    def __post_init__(self):
        problems = []
        if self.objective not in rewards.OBJECTIVES:
            expected = sorted(rewards.OBJECTIVES)
            problems.append(f"objective: expected one of {expected}, got {self.objective!r}")
        if self.method not in METHODS:
            problems.append(f"method: expected one of {METHODS}, got {self.method!r}")
        if not 0.5 <= self.confidence < 1.0:
            problems.append(f"confidence: expected a number in [0.5, 1), got {self.confidence!r}")
        if self.margin < 0:
            problems.append(f"margin: expected >= 0, got {self.margin!r}")
        for name in (
            "min_tasks",
            "max_rewrite_candidates",
            "max_split_candidates",
            "min_leaf_tasks",
            "max_decisions",
            "bootstrap_samples",
        ):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                problems.append(f"{name}: expected a non-negative integer, got {getattr(self, name)!r}")
        if not 0.0 <= self.selection_fraction < 1.0:
            problems.append(
                f"selection_fraction: expected a number in [0, 1), got {self.selection_fraction!r}"
            )
        self.split_quantiles = tuple(float(q) for q in self.split_quantiles)
        if any(not 0 < q < 1 for q in self.split_quantiles):
            problems.append(f"split_quantiles: expected numbers in (0, 1), got {self.split_quantiles!r}")
        self.seeds = tuple(int(s) for s in self.seeds)
        if not self.seeds:
            problems.append("seeds: expected at least one seed")
        if problems:
            raise ValueError("invalid LearnConfig:\n  - " + "\n  - ".join(problems))


# --- candidates --------------------------------------------------------------------------------------
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

    def apply(self, tree: ProfilingTree, catalog: Mapping | None = None) -> ProfilingTree:
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


@dataclass
class LeafContext:
    """What a proposer sees about one leaf.

    Attributes:
        tree: the incumbent. leaf / groups: the leaf and what it shows.
        tasks: training tasks routed to the leaf. metrics: task hash -> routing metrics (all groups).
        rewards: (task hash, configuration name) -> mean reward, for every cell observed so far.
        configurations: name -> groups of the probe configurations (observed on every training task).
        features: features a split may route on (in the tree vocabulary or the catalog, finite for every
            task of the leaf).
        groups_allowed: group names REWRITE/SPLIT may use.
    """

    tree: ProfilingTree
    leaf: str
    groups: tuple[str, ...]
    tasks: list[Task]
    metrics: dict[str, dict[str, float]]
    rewards: dict[tuple[str, str], float]
    configurations: dict[str, tuple[str, ...]]
    features: list[str]
    groups_allowed: list[str]
    config: LearnConfig

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


# --- proposers ---------------------------------------------------------------------------------------
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
        client: Any,
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
        groups = "\n".join(
            f"- {g}: passes={getattr(vocab.get(g), 'passes', None)}; features: "
            f"{', '.join(list(getattr(vocab.get(g), 'features', ()))[:6])}"
            for g in ctx.groups_allowed
        )
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
        try:
            reply = self.client.chat(self.messages(phase, ctx), temperature=self.temperature, seed=self.seed)
        except Exception as e:  # LLMError and friends: a rejected proposal, logged, not a crash
            return [
                Candidate(
                    phase, ctx.leaf, proposer=self.name, invalid=f"LLM call failed: {type(e).__name__}: {e}"
                )
            ]
        self.calls += 0 if getattr(reply, "cached", False) else 1
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


PROPOSERS = {"statistical": StatisticalProposer, "llm": LLMProposer}


# --- the learner -------------------------------------------------------------------------------------
@dataclass
class Decision:
    """One logged decision: the candidate, the test, the evaluations it cost."""

    index: int
    candidate: Candidate
    accepted: bool
    reason: str
    test: PairedTest | None = None
    affected: int = 0
    n_train: int = 0
    global_mean_gain: float = 0.0
    spent: int = 0
    naive: int = 0
    new_cells: int = 0
    tree_fingerprint: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "decision": self.index,
            "operator": self.candidate.operator,
            "leaf": self.candidate.leaf,
            "candidate": self.candidate.to_dict(),
            "description": self.candidate.describe(),
            "accepted": self.accepted,
            "reason": self.reason,
            "stats": None if self.test is None else self.test.as_dict(),
            "affected_tasks": self.affected,
            "train_tasks": self.n_train,
            "global_mean_gain": self.global_mean_gain,
            "evaluations": {"spent": self.spent, "naive": self.naive, "new_cells": self.new_cells},
            "tree": self.tree_fingerprint,
            **self.extra,
        }


class Learner:
    """Grows a profiling tree with REWRITE/SPLIT edits accepted by a paired test.

    Args:
        env: an environment (``profile``, ``outcome``; see ``autoprofiler.environments``).
        tasks: the training tasks.
        proposer: ``StatisticalProposer()`` or ``LLMProposer(client)``.
        config: ``LearnConfig``.
        out_dir: where checkpoints go (``tree.json``, ``proposals.jsonl``, ``state.json``); None: none.
        rewriter: the rewriter passed to ``env.outcome`` (None: the environment's).
        catalog: group name -> ``MetricGroup`` (``autoprofiler.profiling.GROUPS``) for groups and features
            outside the tree's vocabulary; None: only the vocabulary.
        probe_configurations: name -> groups evaluated on every training task first (the oracle sweep
            the statistical proposer ranks from); the incumbent's leaves are always probed too.
        groups: groups collected for every training task (routing features); default: the vocabulary,
            the catalog's groups of the tree's source and the probe configurations' groups.

    Attributes after ``fit``: ``tree_``, ``decisions_`` (list of dicts), ``evaluations_``.
    """

    def __init__(
        self,
        env: Any,
        tasks: Sequence[Task],
        proposer: Any,
        config: LearnConfig | None = None,
        out_dir: str | Path | None = None,
        rewriter: Any = None,
        catalog: Mapping | None = None,
        probe_configurations: Mapping[str, Iterable[str]] | None = None,
        groups: Iterable[str] | None = None,
    ):
        self.env = env
        self.tasks = list(tasks)
        self.proposer = proposer
        self.config = config or LearnConfig()
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.rewriter = rewriter
        self.catalog = catalog
        self.probe_configurations = {k: tuple(v) for k, v in (probe_configurations or {}).items()}
        self.groups = None if groups is None else tuple(groups)
        self._metrics: dict[str, dict[str, float]] = {}
        self._rewards: dict[tuple[str, str], float] = {}
        self.evaluations_ = {
            "sweep": 0,
            "spent": 0,
            "naive": 0,
            "new_cells": 0,
            "decisions": 0,
            "accepted": 0,
        }
        self.decisions_: list[dict[str, Any]] = []
        self.dropped_: list[dict[str, str]] = []

    # -- data ---------------------------------------------------------------------------------------
    def _collect_groups(self, tree: ProfilingTree) -> list[str]:
        if self.groups is not None:
            return sorted(self.groups)
        names = set(tree.vocabulary)
        if self.catalog is not None:
            names |= {n for n, g in self.catalog.items() if getattr(g, "source", tree.source) == tree.source}
        for groups in self.probe_configurations.values():
            names |= set(groups)
        return sorted(names)

    def _prepare(self, tree: ProfilingTree) -> None:
        groups = self._collect_groups(tree)
        if callable(getattr(self.env, "prefetch", None)):
            self.env.prefetch(self.tasks, groups)  # live: one batched profiling run instead of many
        kept = []
        for t in self.tasks:
            try:
                self._metrics[t.hash] = dict(self.env.profile(t, groups).metrics)
                kept.append(t)
            except Exception as e:  # a task we cannot profile is dropped, with its reason
                logger.warning("dropping training task %s: %s", t.id, e)
                self.dropped_.append({"task_id": t.id, "reason": f"{type(e).__name__}: {e}"})
        self.tasks = kept
        f = self.config.selection_fraction
        held = {t.hash for t in kept if f > 0 and _unit(t.hash) < f}
        if f > 0 and (not held or held == {t.hash for t in kept}):  # tiny sets: keep both sides non-empty
            held = {t.hash for t in kept[len(kept) // 2 :]} if len(kept) > 1 else set()
        self.test_tasks_ = [t for t in kept if t.hash in held] if f > 0 else list(kept)
        self.proposal_tasks_ = [t for t in kept if t.hash not in held] if f > 0 else list(kept)
        self._groups_allowed = groups
        if hasattr(self.env.profiler, "reset"):
            self.env.profiler.reset()

    def reward(self, task: Task, configuration: str) -> float:
        """Mean value under ``config.objective`` over ``config.seeds`` of (task, configuration); memoized."""
        key = (task.hash, configuration)
        if key not in self._rewards:
            vals = [
                rewards.objective(
                    self.env.outcome(task, configuration, self.rewriter, seed, 0), self.config.objective
                )
                for seed in self.config.seeds
            ]
            self._rewards[key] = sum(vals) / len(vals)
            self.evaluations_["new_cells"] += len(vals)
        return self._rewards[key]

    def leaf_of(self, tree: ProfilingTree, task: Task) -> str:
        return tree.apply(self._metrics[task.hash])

    def configuration_of(self, tree: ProfilingTree, task: Task) -> str:
        return rewards.configuration_name(tree.leaf(self.leaf_of(tree, task)).groups)

    def tree_rewards(self, tree: ProfilingTree, tasks: Sequence[Task] | None = None) -> dict[str, float]:
        """task hash -> reward of the tree's configuration for that task."""
        return {t.hash: self.reward(t, self.configuration_of(tree, t)) for t in (tasks or self.tasks)}

    def _features(self, tree: ProfilingTree, tasks: list[Task]) -> list[str]:
        names = {f for spec in tree.vocabulary.values() for f in spec.features}
        if self.catalog is not None:
            for g in self.catalog.values():
                if getattr(g, "source", tree.source) == tree.source:
                    names |= set(getattr(g, "metrics", ())) | set(getattr(g, "derived", ()) or ())
        out = []
        for f in sorted(names):
            vals = [self._metrics[t.hash].get(f) for t in tasks]
            if all(isinstance(v, int | float) and math.isfinite(v) for v in vals) and len(set(vals)) > 1:
                out.append(f)
        return out

    def context(self, tree: ProfilingTree, leaf: str) -> LeafContext:
        """What the proposer sees of ``leaf``: the proposal tasks routed to it and their rewards."""
        tasks = [t for t in self.proposal_tasks_ if self.leaf_of(tree, t) == leaf]
        probes = dict(self.probe_configurations)
        return LeafContext(
            tree,
            leaf,
            tree.leaf(leaf).groups,
            tasks,
            self._metrics,
            self._rewards,
            probes,
            self._features(tree, tasks),
            self._groups_allowed,
            self.config,
        )

    # -- one decision -------------------------------------------------------------------------------
    def decide(
        self, tree: ProfilingTree, cand: Candidate, index: int, n_tried: int = 1
    ) -> tuple[Decision, ProfilingTree | None]:
        """Test one candidate against ``tree``; returns the decision and the candidate tree if accepted."""
        n_train, seeds, n_test = len(self.tasks), len(self.config.seeds), len(self.test_tasks_)
        if cand.invalid:
            return Decision(index, cand, False, f"invalid proposal: {cand.invalid}", n_train=n_train), None
        try:
            new = cand.apply(tree, self.catalog)
        except (TreeError, KeyError, ValueError) as e:
            return Decision(
                index, cand, False, f"edit refused by the tree (budget or names): {e}", n_train=n_train
            ), None
        affected = [t for t in self.test_tasks_ if self.leaf_of(tree, t) == cand.leaf]
        before = self.evaluations_["new_cells"]
        gains, moved = [], {}
        for t in affected:  # map over (task, configuration): the shape a Ray fan-out takes later
            c_old, c_new = self.configuration_of(tree, t), self.configuration_of(new, t)
            gains.append(self.reward(t, c_new) - self.reward(t, c_old))
            moved[c_new] = moved.get(c_new, 0) + 1
        confidence = self.config.confidence
        if self.config.bonferroni and n_tried > 1:
            confidence = 1.0 - (1.0 - confidence) / n_tried
        test = paired_test(
            gains,
            self.config.method,
            confidence,
            self.config.margin,
            self.config.min_tasks,
            self.config.bootstrap_samples,
            seed=index,
        )
        spent, naive = len(affected) * seeds, n_train * seeds
        self.evaluations_["spent"] += spent
        self.evaluations_["naive"] += naive
        d = Decision(
            index,
            cand,
            test.accepted,
            test.reason,
            test,
            len(affected),
            n_train,
            sum(gains) / n_test if n_test else 0.0,
            spent,
            naive,
            self.evaluations_["new_cells"] - before,
            (new if test.accepted else tree).fingerprint(),
            {"configurations_after": moved},
        )
        return d, (new if test.accepted else None)

    # -- checkpoints ------------------------------------------------------------------------------
    def _checkpoint(self, tree: ProfilingTree, state: dict[str, Any], decision: Decision | None) -> None:
        if decision is not None:
            rec = decision.as_dict()
            rec["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.decisions_.append(rec)
            logger.info(
                "decision %d: %s -> %s (%s)",
                decision.index,
                decision.candidate.describe(),
                "ACCEPT" if decision.accepted else "reject",
                " ".join(decision.reason.split()),  # one log line; the JSON log keeps the reason as is
            )
        if self.out_dir is None:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if decision is not None:
            with open(self.out_dir / "proposals.jsonl", "a") as f:
                f.write(json.dumps(self.decisions_[-1], default=str) + "\n")
        save_tree(tree, self.out_dir / "tree.json")
        state = {
            **state,
            "evaluations": self.evaluations_,
            "rewards": [[h, c, r] for (h, c), r in sorted(self._rewards.items())],
        }
        tmp = self.out_dir / "state.json.tmp"
        tmp.write_text(json.dumps(state, indent=1, default=str))
        tmp.replace(self.out_dir / "state.json")

    def _load_checkpoint(self) -> tuple[ProfilingTree, dict[str, Any]] | None:
        if self.out_dir is None or not (self.out_dir / "state.json").exists():
            return None
        state = json.loads((self.out_dir / "state.json").read_text())
        tree = load_tree(self.out_dir / "tree.json")
        self.evaluations_.update(state.get("evaluations", {}))
        self._rewards.update({(h, c): r for h, c, r in state.get("rewards", [])})
        log = self.out_dir / "proposals.jsonl"
        if log.exists():
            self.decisions_ = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
            # a decision logged after the last state write (crash in between) is dropped from the log
            self.decisions_ = self.decisions_[: state["decisions"]]
            log.write_text("".join(json.dumps(d, default=str) + "\n" for d in self.decisions_))
        return tree, state

    # -- the loop ---------------------------------------------------------------------------------
    def fit(self, tree: ProfilingTree, resume: bool = False) -> ProfilingTree:
        """Grow ``tree`` on the training tasks; returns the learned tree (also ``self.tree_``).

        With ``resume=True`` and a checkpoint in ``out_dir``, continues from the last decision (the
        incumbent, the leaf queue and the pending candidates are restored; evaluations come from the
        environment's table, so none is repeated).
        """
        loaded = self._load_checkpoint() if resume else None
        if resume and loaded is None:
            logger.info("no checkpoint in %s: starting fresh", self.out_dir)
        if loaded is None and self.out_dir is not None and (self.out_dir / "proposals.jsonl").exists():
            (self.out_dir / "proposals.jsonl").unlink()
        start = loaded[0] if loaded else tree
        self._prepare(start)
        if not self.tasks:
            raise ValueError("no training task could be profiled; see learner.dropped_")
        # the probe sweep: every probe configuration and every incumbent leaf on every training task
        before = self.evaluations_["new_cells"]
        for t in self.tasks:
            for groups in self.probe_configurations.values():
                self.reward(t, rewards.configuration_name(groups))
            self.reward(t, self.configuration_of(start, t))
        self.evaluations_["sweep"] = (
            self.evaluations_["new_cells"] - before if not loaded else self.evaluations_["sweep"]
        )
        if loaded:
            tree, state = loaded
        else:
            state = {
                "queue": list(tree.leaf_ids),
                "leaf": None,
                "phase": "REWRITE",
                "pending": None,
                "tried": 0,
                "rewrites_on_leaf": 0,
                "decisions": 0,
                "done": False,
            }
            self._checkpoint(tree, state, None)
        cfg = self.config
        while not state["done"]:
            if state["decisions"] >= cfg.max_decisions:
                logger.info("max_decisions %d reached", cfg.max_decisions)
                break
            if state["pending"] is None:
                if state["leaf"] is None:
                    if not state["queue"]:
                        state["done"] = True
                        break
                    state.update(leaf=state["queue"].pop(0), phase="REWRITE", rewrites_on_leaf=0)
                leaf = state["leaf"]
                if leaf not in tree.leaf_ids:
                    state.update(leaf=None, pending=None)
                    continue
                ctx = self.context(tree, leaf)
                n_test = sum(1 for t in self.test_tasks_ if self.leaf_of(tree, t) == leaf)
                if not ctx.tasks or n_test < max(cfg.min_tasks, 1):
                    logger.info(
                        "leaf %s: %d proposal and %d test tasks (min_tasks %d): skipped",
                        leaf,
                        len(ctx.tasks),
                        n_test,
                        cfg.min_tasks,
                    )
                    state.update(leaf=None, pending=None)
                    continue
                limit = (
                    cfg.max_rewrite_candidates if state["phase"] == "REWRITE" else cfg.max_split_candidates
                )
                proposals = self.proposer.propose(state["phase"], ctx)
                picked = []
                for c in proposals:  # keep the first `limit` that the budget allows; log the others
                    if len(picked) >= limit:
                        break
                    if not c.invalid:
                        try:
                            c.apply(tree, self.catalog)
                        except (TreeError, KeyError, ValueError) as e:
                            c.invalid = f"edit refused by the tree (budget or names): {str(e)[:300]}"
                    picked.append(c)
                state["pending"] = [c.to_dict() for c in picked]
                state["tried"] = sum(1 for c in picked if not c.invalid)
            if not state["pending"]:
                if state["phase"] == "REWRITE":
                    state.update(phase="SPLIT", pending=None)
                else:
                    state.update(leaf=None, pending=None)
                continue
            cand = Candidate.from_dict(state["pending"].pop(0))
            decision, new = self.decide(tree, cand, state["decisions"], max(1, state["tried"]))
            state["decisions"] += 1
            self.evaluations_["decisions"] += 1
            if new is not None:
                tree = new
                self.evaluations_["accepted"] += 1
                if cand.operator == "REWRITE":
                    state["rewrites_on_leaf"] += 1
                    state["pending"] = [] if state["rewrites_on_leaf"] >= cfg.max_rewrites_per_leaf else None
                else:
                    node = tree.node(cand.leaf)
                    state["queue"] += [node.left, node.right]
                    state.update(leaf=None, pending=None)
            self._checkpoint(tree, state, decision)
        self._checkpoint(tree, state, None)
        self.tree_ = tree
        return tree

    def summary(self) -> dict[str, Any]:
        """Counts for a report: decisions, accepted, evaluations spent vs naive, dropped tasks."""
        ev = dict(self.evaluations_)
        ev["saved_fraction"] = 1.0 - ev["spent"] / ev["naive"] if ev["naive"] else 0.0
        return {
            "train_tasks": len(self.tasks),
            "evaluations": ev,
            "dropped": self.dropped_,
            "accepted": [d["description"] for d in self.decisions_ if d["accepted"]],
        }
