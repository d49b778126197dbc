"""Learner settings: one dataclass of plain values, validated at once (a run's config is one JSON object).

It sits below both the proposers (which read the split settings) and the learner, so neither imports
the other to know its settings. The allowed values are declared as data (``_CHOICES``, ``_UNIT_RANGES``,
``_COUNTS``) and checked in one place, ``LearnConfig.__post_init__``.

Example:
    >>> LearnConfig(confidence=0.9, seeds=[0, 1]).seeds
    (0, 1)
    >>> round(LearnConfig(confidence=0.9, max_decisions=10).level(), 6)   # error_control="run"
    0.01
"""

from __future__ import annotations

from dataclasses import dataclass

from autoprofiler import rewards
from autoprofiler.learning.stats import METHODS

__all__ = ["ERROR_CONTROLS", "LearnConfig"]

#: What ``confidence`` bounds (``LearnConfig.error_control``): the whole run, or each decision alone.
ERROR_CONTROLS = ("run", "decision")

_CHOICES = {
    "method": METHODS,
    "objective": tuple(sorted(rewards.OBJECTIVES)),
    "error_control": ERROR_CONTROLS,
}
#: field -> (low, high): a number in [low, high)
_UNIT_RANGES = {"confidence": (0.5, 1.0), "selection_fraction": (0.0, 1.0)}
_COUNTS = (  # non-negative integers
    "min_tasks",
    "bootstrap_samples",
    "max_rewrite_candidates",
    "max_split_candidates",
    "max_rewrites_per_leaf",
    "min_leaf_tasks",
    "max_decisions",
)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass
class LearnConfig:
    """Learner settings (all plain values, so a run's config is one JSON object).

    Attributes:
        method, confidence, margin, min_tasks, bootstrap_samples: the acceptance test (``paired_test``).
        error_control: what ``confidence`` bounds (``level`` gives the level each decision is tested at):

            - ``"run"`` (default): the chance that the whole run accepts any edit that does not help is at
              most ``alpha = 1 - confidence``. Each decision is tested at ``alpha / max_decisions``
              (alpha spending, uniform); a run makes at most ``max_decisions`` decisions, so by the union
              bound the levels of all its decisions sum to at most ``alpha``. Why uniform and not
              front-loaded (``alpha * 2**-(k+1)``): the decision order is breadth first over leaves, not an
              order of importance, and a geometric schedule gives the 8th decision ``alpha / 256``, out
              of reach of the sign-flip guard below 8 + log2(1/alpha) non-zero gains, so it would cap
              the tree by the schedule instead of the evidence; uniform spending makes the trade-off one
              explicit knob: fewer allowed decisions, more power for each.
              What the bound covers: with ``selection_fraction > 0`` and no edit of any tree helping
              (every configuration's rewards on a task exchangeable), every candidate up to the run's
              first accept is chosen from the proposal tasks and the routing metrics alone, so each test
              accepts with chance at most its level (the sign-flip guard's does, whatever the
              distribution of the gains) and P(any accept) <= alpha. After a true accept, later
              hypotheses depend on the acceptance tasks through that accept; the bound is not proved
              there. With ``selection_fraction = 0`` it does not hold (the proposer ranks on the
              acceptance tasks). Measured: ``bench/results/null_false_accept_cpu.md``.
            - ``"decision"``: the paper's semantics: each decision at ``1 - confidence`` (divided by the
              candidates tried on the leaf when ``bonferroni``); a run of many decisions then accepts
              some null edit far more often than ``1 - confidence`` (the same table).
        max_rewrite_candidates / max_split_candidates: candidates tried per leaf and phase.
        max_rewrites_per_leaf: accepted REWRITEs on one leaf before moving on to SPLIT.
        split_quantiles: where split thresholds are placed among the leaf's tasks' feature values.
        min_leaf_tasks: each side of a split must keep at least this many training tasks.
        max_decisions: stop after this many decisions (a bound on training cost, and with
            ``error_control="run"`` the number the run's level is spread over).
        seeds: evaluation seeds averaged per task (the paired unit is the task).
        bonferroni: with ``error_control="decision"`` only: divide the test's level by the number of
            candidates tried per (leaf, phase), so the chance of any false accept on a leaf stays at the
            configured level.
        selection_fraction: share of the training tasks (fixed by task hash) kept out of the proposers'
            view and used for the acceptance test. Proposers pick candidates by their observed gain, so
            testing on the same tasks accepts noise far above the configured level (see the null test);
            0 tests on the tasks the proposer saw (the paper's literal protocol).
        objective: what a paired gain is measured in (``rewards.OBJECTIVES``): ``reward`` (the paper's:
            ``max(0, log speedup)`` when correct) or ``log_speedup`` (``log`` of the effective speedup,
            unclipped: avoiding a slowdown counts, as it does in the geomean policies are judged by).

    Raises: ``ValueError`` naming every problem at once, on one line (``field: expected ..., got ...``).
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
    error_control: str = "run"

    def __post_init__(self):
        problems = []
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)  # a field named in a loop, not a probe of an unknown type
            if value not in allowed:
                problems.append(f"{name}: expected one of {list(allowed)}, got {value!r}")
        for name, (low, high) in _UNIT_RANGES.items():
            value = getattr(self, name)
            if not _is_number(value) or not low <= value < high:
                problems.append(f"{name}: expected a number in [{low}, {high}), got {value!r}")
        if not _is_number(self.margin) or not self.margin >= 0:
            problems.append(f"margin: expected a number >= 0, got {self.margin!r}")
        for name in _COUNTS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                problems.append(f"{name}: expected a non-negative integer, got {value!r}")
        if not isinstance(self.bonferroni, bool):
            problems.append(f"bonferroni: expected true or false, got {self.bonferroni!r}")
        elif self.bonferroni and self.error_control == "run":
            problems.append(
                "bonferroni: expected false with error_control 'run' (it already spreads the level over "
                "the run's decisions; bonferroni is for error_control 'decision'), got True"
            )
        try:
            self.split_quantiles = tuple(float(q) for q in self.split_quantiles)
            if any(not 0 < q < 1 for q in self.split_quantiles):
                raise ValueError
        except (TypeError, ValueError):
            problems.append(f"split_quantiles: expected numbers in (0, 1), got {self.split_quantiles!r}")
        try:
            self.seeds = tuple(int(s) for s in self.seeds)
            if not self.seeds:
                raise ValueError
        except (TypeError, ValueError):
            problems.append(f"seeds: expected a non-empty list of integers, got {self.seeds!r}")
        if problems:
            raise ValueError("invalid LearnConfig: " + "; ".join(problems))

    def level(self, candidates_on_leaf: int = 1) -> float:
        """The false-accept level one decision is tested at (``paired_test(confidence=1 - level)``).

        ``error_control="run"``: ``(1 - confidence) / max_decisions``. ``"decision"``: ``1 - confidence``,
        divided by ``candidates_on_leaf`` when ``bonferroni``.
        """
        alpha = 1.0 - self.confidence
        if self.error_control == "run":
            return alpha / max(1, self.max_decisions)
        if self.bonferroni and candidates_on_leaf > 1:
            return alpha / candidates_on_leaf
        return alpha
