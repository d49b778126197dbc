"""Learner settings: one dataclass of plain values, validated at once (a run's config is one JSON object).

It sits below both the proposers (which read the split settings) and the learner, so neither imports
the other to know its settings.

Example:
    >>> LearnConfig(confidence=0.9, seeds=[0, 1]).seeds
    (0, 1)
"""

from __future__ import annotations

from dataclasses import dataclass

from autoprofiler import rewards
from autoprofiler.learning.stats import METHODS

__all__ = ["LearnConfig"]


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

    Raises: ``ValueError`` listing every problem at once.
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
            value = getattr(self, name)  # a field named in a loop, not a probe of an unknown type
            if not isinstance(value, int) or value < 0:
                problems.append(f"{name}: expected a non-negative integer, got {value!r}")
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
