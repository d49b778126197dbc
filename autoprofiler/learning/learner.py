"""The learning loop: grow a profiling tree with REWRITE/SPLIT edits accepted by a paired test.

For each leaf of the incumbent tree (breadth first), REWRITE candidates (groups to add to the leaf) are
tried first, then SPLIT candidates (feature, threshold, and the groups each new leaf shows). Each
candidate tree is compared with the incumbent on the training tasks, paired: only the tasks routed to the
changed leaf can change (every other paired difference is exactly zero by construction), so only those
are evaluated. A candidate is accepted when a one-sided lower confidence bound of the mean paired reward
gain over the affected acceptance tasks exceeds ``margin``, the sign-flip p-value of "no gain" is
at most the decision's level, and at least ``min_tasks`` tasks are affected (``stats.paired_test``).
The level is ``LearnConfig.level()``: by default (``error_control="run"``) the run's ``1 - confidence``
spread evenly over ``max_decisions``, so the chance that a run accepts any edit that does not help stays
at ``1 - confidence``; ``error_control="decision"`` tests each decision at ``1 - confidence`` (the
paper's). Proposers see only the selection tasks (``LeafContext``), never an acceptance task's reward.

Work goes to the environment in batches, submitted at once and then gathered (what a fan-out over GPU
workers parallelizes): the probe sweep is one ``Environment.outcomes`` call, and each decision is one
call for the incumbent and candidate cells of every affected task and seed. Per (task, configuration)
the mean objective over the seeds is memoized, so no cell is asked for twice.

After every decision the learner checkpoints: the incumbent tree (``tree.json``), one JSON line per
proposal in ``proposals.jsonl`` (statistics, accepted or why not, evaluations spent against a naive full
re-evaluation) and its loop state and memo (``state.json``), so ``fit(..., resume=True)`` continues from
the last decision.

Example (replay, no GPU, no LLM)::

    env = ReplayEnvironment.from_dir("datasets/h200_suite", rewriter=RuleRewriter())
    learner = Learner(env, train_tasks, StatisticalProposer(), LearnConfig(confidence=0.9), out_dir="runs/x")
    tree = learner.fit(load_tree("trees/seed.json"))
    learner.summary()["evaluations"]        # {"spent": 212, "naive": 1480, ...}
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoprofiler import rewards
from autoprofiler.learning.config import LearnConfig
from autoprofiler.learning.proposers import Candidate, LeafContext, Proposer
from autoprofiler.learning.stats import PairedTest, paired_test
from autoprofiler.tasks import Task
from autoprofiler.tree import ProfilingTree, TreeError, load_tree, save_tree

if TYPE_CHECKING:
    from autoprofiler.environments import Environment
    from autoprofiler.profiling.groups import MetricGroup
    from autoprofiler.rewriters.base import Rewriter

__all__ = ["Decision", "LearnConfig", "Learner"]

logger = logging.getLogger(__name__)


def _unit(text: str) -> float:
    """A number in [0, 1) fixed by ``text`` (used to assign tasks to proposal / test subsets)."""
    return int(hashlib.sha256(("selection:" + text).encode()).hexdigest()[:12], 16) / float(16**12)


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
        env: where profiles and reward rows come from (``autoprofiler.environments.Environment``); the
            learner uses ``cell``, ``outcomes``, ``prefetch``, ``profile`` and ``profiler.reset``.
        tasks: the training tasks.
        proposer: ``StatisticalProposer()`` or ``LLMProposer(client)``.
        config: ``LearnConfig``.
        out_dir: where checkpoints go (``tree.json``, ``proposals.jsonl``, ``state.json``); None: none.
        rewriter: the rewriter of the cells asked for (a ``Rewriter`` or its identity; None: the
            environment's).
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
        env: Environment,
        tasks: Sequence[Task],
        proposer: Proposer,
        config: LearnConfig | None = None,
        out_dir: str | Path | None = None,
        rewriter: Rewriter | str | None = None,
        catalog: Mapping[str, MetricGroup] | None = None,
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
    def _catalog_groups(self, source: str) -> list[MetricGroup]:
        return [] if self.catalog is None else [g for g in self.catalog.values() if g.source == source]

    def _collect_groups(self, tree: ProfilingTree) -> list[str]:
        if self.groups is not None:
            return sorted(self.groups)
        names = set(tree.vocabulary) | {g.name for g in self._catalog_groups(tree.source)}
        for groups in self.probe_configurations.values():
            names |= set(groups)
        return sorted(names)

    def _prepare(self, tree: ProfilingTree) -> None:
        groups = self._collect_groups(tree)
        self.env.prefetch(self.tasks, groups)  # live: one batched profiling run instead of many
        kept = []
        for t in self.tasks:
            try:
                profile = self.env.profile(t, groups)
                if profile is None:
                    raise ValueError(f"no groups to profile (groups={groups})")
                self._metrics[t.hash] = dict(profile.metrics)
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
        self.env.profiler.reset()

    def evaluate(self, pairs: Iterable[tuple[Task, str]]) -> list[float]:
        """Mean value under ``config.objective`` over ``config.seeds`` of each (task, configuration).

        Pairs not in the memo become cells (one per seed) sent to the environment in one
        ``outcomes`` call; the memo answers the rest, so no cell is asked for twice.

        Returns: the means, in the order of ``pairs``.

        Raises: what ``Environment.outcomes`` raises for a cell without a row (``MissingOutcome``,
        ``MissingProfile``, ``CellFailed``); the rows it could compute are stored by the environment.
        """
        pairs = list(pairs)
        missing: dict[tuple[str, str], Task] = {}
        for task, configuration in pairs:
            key = (task.hash, configuration)
            if key not in self._rewards:
                missing.setdefault(key, task)
        if missing:
            seeds = self.config.seeds
            cells = [
                self.env.cell(task, configuration, self.rewriter, seed, 0)
                for (_, configuration), task in missing.items()
                for seed in seeds
            ]
            logger.debug("asking the environment for %d cells (%d configurations)", len(cells), len(missing))
            rows = self.env.outcomes(cells)
            for i, key in enumerate(missing):
                per_seed = rows[i * len(seeds) : (i + 1) * len(seeds)]
                vals = [rewards.objective(row, self.config.objective) for row in per_seed]
                self._rewards[key] = sum(vals) / len(vals)
            self.evaluations_["new_cells"] += len(cells)
        return [self._rewards[(t.hash, c)] for t, c in pairs]

    def reward(self, task: Task, configuration: str) -> float:
        """Mean value under ``config.objective`` over ``config.seeds`` of (task, configuration); memoized."""
        return self.evaluate([(task, configuration)])[0]

    def probe(self, tree: ProfilingTree) -> int:
        """The probe sweep: every probe configuration and ``tree``'s configuration on every training task,
        in one ``outcomes`` call; returns the number of new cells."""
        before = self.evaluations_["new_cells"]
        probes = [rewards.configuration_name(g) for g in self.probe_configurations.values()]
        self.evaluate((t, c) for t in self.tasks for c in [*probes, self.configuration_of(tree, t)])
        return self.evaluations_["new_cells"] - before

    def leaf_of(self, tree: ProfilingTree, task: Task) -> str:
        return tree.apply(self._metrics[task.hash])

    def configuration_of(self, tree: ProfilingTree, task: Task) -> str:
        return rewards.configuration_name(tree.leaf(self.leaf_of(tree, task)).groups)

    def tree_rewards(self, tree: ProfilingTree, tasks: Sequence[Task] | None = None) -> dict[str, float]:
        """task hash -> reward of the tree's configuration for that task (one batch for the missing)."""
        tasks = list(tasks or self.tasks)
        values = self.evaluate((t, self.configuration_of(tree, t)) for t in tasks)
        return {t.hash: v for t, v in zip(tasks, values, strict=True)}

    def _features(self, tree: ProfilingTree, tasks: list[Task]) -> list[str]:
        names = {f for spec in tree.vocabulary.values() for f in spec.features}
        for g in self._catalog_groups(tree.source):
            names |= set(g.metrics)
        out = []
        for f in sorted(names):
            vals = [self._metrics[t.hash].get(f) for t in tasks]
            if all(isinstance(v, int | float) and math.isfinite(v) for v in vals) and len(set(vals)) > 1:
                out.append(f)
        return out

    def context(self, tree: ProfilingTree, leaf: str) -> LeafContext:
        """What the proposer sees of ``leaf``: the selection tasks routed to it, their metrics and rewards
        (``LeafContext.of`` keeps only their entries: no acceptance task's reward reaches a proposer)."""
        tasks = [t for t in self.proposal_tasks_ if self.leaf_of(tree, t) == leaf]
        return LeafContext.of(
            tree,
            leaf,
            tasks,
            self._metrics,
            self._rewards,
            self.probe_configurations,
            self._features(tree, tasks),
            self._groups_allowed,
            self.config,
        )

    # -- one decision -------------------------------------------------------------------------------
    def decide(
        self, tree: ProfilingTree, cand: Candidate, index: int, n_tried: int = 1
    ) -> tuple[Decision, ProfilingTree | None]:
        """Test one candidate against ``tree``; returns the decision and the candidate tree if accepted.

        The test runs at ``config.level(n_tried)`` (``n_tried``: candidates tried on this (leaf, phase),
        which only ``bonferroni`` under ``error_control="decision"`` uses); the level is logged.

        The incumbent and candidate cells of every affected test task and seed go to the environment
        in one ``outcomes`` call (none when the memo holds them all); gains come from the memo.
        """
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
        paired = [(t, self.configuration_of(tree, t), self.configuration_of(new, t)) for t in affected]
        self.evaluate(p for t, c_old, c_new in paired for p in ((t, c_old), (t, c_new)))
        gains, moved = [], {}
        for t, c_old, c_new in paired:
            gains.append(self._rewards[(t.hash, c_new)] - self._rewards[(t.hash, c_old)])
            moved[c_new] = moved.get(c_new, 0) + 1
        level = self.config.level(n_tried)
        test = paired_test(
            gains,
            self.config.method,
            1.0 - level,
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
            {"configurations_after": moved, "level": level, "error_control": self.config.error_control},
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
        tmp.write_text(json.dumps(state, default=str))  # no indent: json's C encoder (the memo is large)
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
        incumbent, the leaf queue and the pending candidates are restored; rewards come from the
        checkpoint's memo and the environment's table, so no evaluation is repeated).

        Raises: ``ValueError`` when no training task could be profiled (see ``dropped_``); what
        ``Environment.outcomes`` raises for a cell the environment cannot answer.
        """
        loaded = self._load_checkpoint() if resume else None
        if resume and loaded is None:
            logger.info("no checkpoint in %s: starting fresh", self.out_dir)
        if loaded is None and self.out_dir is not None and (self.out_dir / "proposals.jsonl").exists():
            (self.out_dir / "proposals.jsonl").unlink()
        start = loaded[0] if loaded else tree
        if self.config.error_control == "run" and self.config.selection_fraction == 0:
            logger.warning(
                "error_control 'run' with selection_fraction 0: the proposer ranks candidates on the "
                "acceptance tasks, so the run-level bound does not hold (see the null benchmark, "
                "bench/results/null_false_accept_cpu.md)"
            )
        self._prepare(start)
        if not self.tasks:
            raise ValueError("no training task could be profiled; see learner.dropped_")
        swept = self.probe(start)
        if not loaded:
            self.evaluations_["sweep"] = swept
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
                state["pending"] = [c.to_dict() for c in self._pick(tree, state["phase"], ctx)]
                state["tried"] = sum(1 for c in state["pending"] if not c["invalid"])
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

    def _pick(self, tree: ProfilingTree, phase: str, ctx: LeafContext) -> list[Candidate]:
        """The proposer's first candidates for (leaf, phase), up to the phase's limit; an edit the tree
        refuses (budget, names) is kept with ``invalid`` set, so it is logged without evaluation."""
        limit = self.config.max_rewrite_candidates if phase == "REWRITE" else self.config.max_split_candidates
        picked: list[Candidate] = []
        for c in self.proposer.propose(phase, ctx):
            if len(picked) >= limit:
                break
            if not c.invalid:
                try:
                    c.apply(tree, self.catalog)
                except (TreeError, KeyError, ValueError) as e:
                    c.invalid = f"edit refused by the tree (budget or names): {str(e)[:300]}"
            picked.append(c)
        return picked

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
