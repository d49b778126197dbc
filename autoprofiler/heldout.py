"""Held-out study computations: the study split, paired bootstrap intervals, choosing a k-group
configuration on the training side with its ties kept.

Pure functions of task hashes and numbers (numpy), so ``bench/heldout_study.py`` can fix its split
before it reads any outcome, and tests can check each piece on hand-made inputs.

- ``study_split``: the train / held-out split of a study, the playbook's split
  (``autoprofiler.rewriters.split``: one task in three by content hash is a tuning task). The playbook
  rewriter's thresholds and the experience rewriter's fit used tuning tasks only, so taking the
  tuning side as the training side keeps every held-out task unseen by those rewriters and by
  anything fitted on the training side (a learner, the choice of a best configuration).
- ``bootstrap_mean`` / ``paired_difference``: percentile bootstrap intervals of a mean over tasks (the
  task is the unit resampled); on log effective speedups ``Interval.exp`` turns the mean into a
  geomean and a difference into a ratio of geomeans. The same ``seed`` and task count give the same
  resampled task sets, so intervals of several policies over the same tasks are paired.
- ``subsets`` / ``ties_at_best``: every subset of a group list (as bit masks over that list), and the
  keys sharing the best score.
- ``SubsetMatrix`` / ``choose_on_train``: per (task, subset of groups) the effective speedup a rewriter
  reached (nan: no recorded outcome), and the subsets among some columns with the best training mean,
  every tie kept (a training side of 9 tasks ties many subsets; a study scores the tied set, not an
  arbitrary first one), with their per-task value on other tasks.
- ``objective_value``: the two objectives of an effective speedup ``s``: ``log s`` and ``max(0, log s)``.

Example::

    >>> iv = bootstrap_mean([0.0, 2.0], samples=4000, seed=0)
    >>> iv.estimate, iv.low, iv.high, iv.n
    (1.0, 0.0, 2.0, 2)
    >>> paired_difference([1.0, 2.0], [0.5, 1.5]).estimate
    0.5
    >>> [sorted(s) for s in subsets(["a", "b"])]
    [[], ['a'], ['b'], ['a', 'b']]
    >>> ties_at_best({"x": 0.5, "y": 0.5, "z": 0.1})
    ['x', 'y']
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from autoprofiler.rewriters.split import SPLIT_SALT, is_tuning_task
from autoprofiler.tasks import Task

__all__ = [
    "OBJECTIVES",
    "Choice",
    "Interval",
    "StudySplit",
    "SubsetMatrix",
    "bootstrap_mean",
    "choose_on_train",
    "objective_value",
    "paired_difference",
    "study_split",
    "subsets",
    "ties_at_best",
]

K = TypeVar("K", bound=Hashable)

#: The objectives a study scores (``objective_value``): the log effective speedup (its mean is the log of
#: the geomean) and the clipped reward of ``autoprofiler.rewards.reward``.
OBJECTIVES = ("log_speedup", "reward")
_FLOOR = 1e-12  # effective speedups are clipped here before the log, as in analysis.geomean

#: Scores within this of the best count as tied (sums of the same logs in another order differ by ~1e-16).
TIE_TOLERANCE = 1e-12


@dataclass(frozen=True)
class StudySplit:
    """Which tasks a study trains on and which it judges on.

    Attributes:
        train: task ids of the training side (the playbook's tuning tasks), in the given order.
        held_out: task ids of the held-out side, in the given order.
        rule: how a task's side is decided (the salted content-hash rule of ``rewriters.split``).
    """

    train: tuple[str, ...]
    held_out: tuple[str, ...]
    rule: str

    def as_dict(self) -> dict[str, object]:
        return {"rule": self.rule, "train": list(self.train), "held_out": list(self.held_out)}


def study_split(tasks: Sequence[Task]) -> StudySplit:
    """The study split of ``tasks``: a task trains when ``rewriters.split.is_tuning_task(task.hash)``.

    Decided by each task's content hash alone (no id, outcome or profile), so it is fixed before any
    outcome is read and the same tasks always land on the same side.

    Raises:
        ValueError: a task id given twice, or a side left empty (nothing to train on or to judge).
    """
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        twice = sorted({i for i in ids if ids.count(i) > 1})
        raise ValueError(f"study_split: expected distinct task ids, got {twice} more than once")
    train = tuple(t.id for t in tasks if is_tuning_task(t.hash))
    held_out = tuple(t.id for t in tasks if not is_tuning_task(t.hash))
    if not train or not held_out:
        raise ValueError(
            f"study_split: expected tasks on both sides, got {len(train)} train and {len(held_out)} "
            f"held out of {len(ids)}"
        )
    rule = f'tuning (train) when int(sha256("{SPLIT_SALT}:" + task_hash)[:8], 16) % 3 == 0'
    return StudySplit(train, held_out, rule)


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` tasks and its percentile bootstrap interval at ``confidence``."""

    estimate: float
    low: float
    high: float
    n: int
    confidence: float = 0.95

    def exp(self) -> Interval:
        """The interval on the exp scale (a mean log speedup -> a geomean; a difference -> a ratio)."""
        return Interval(
            math.exp(self.estimate), math.exp(self.low), math.exp(self.high), self.n, self.confidence
        )

    def as_dict(self) -> dict[str, float | int]:
        return {
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "n": self.n,
            "confidence": self.confidence,
        }


def bootstrap_mean(
    values: Sequence[float], samples: int = 2000, seed: int = 0, confidence: float = 0.95
) -> Interval:
    """The mean of ``values`` and its percentile bootstrap interval (tasks resampled with replacement).

    Args:
        values: one number per task (finite).
        samples: bootstrap resamples.
        seed: the generator's seed; with the same seed and ``len(values)`` the same tasks are drawn.
        confidence: the interval's coverage, in (0, 1).

    Raises:
        ValueError: no values, a value that is not finite, ``samples`` < 1 or ``confidence`` outside (0, 1).
    """
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"bootstrap_mean: expected a non-empty list of numbers, got {len(x)} values")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"bootstrap_mean: expected finite values, got {x[~np.isfinite(x)][:3].tolist()}")
    if not isinstance(samples, int) or samples < 1:
        raise ValueError(f"bootstrap_mean: samples: expected a positive integer, got {samples!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"bootstrap_mean: confidence: expected a number in (0, 1), got {confidence!r}")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(samples, x.size))].mean(axis=1)
    low, high = np.quantile(means, [(1 - confidence) / 2, 1 - (1 - confidence) / 2])
    return Interval(float(x.mean()), float(low), float(high), int(x.size), confidence)


def paired_difference(
    a: Sequence[float], b: Sequence[float], samples: int = 2000, seed: int = 0, confidence: float = 0.95
) -> Interval:
    """``bootstrap_mean`` of the per-task differences ``a[i] - b[i]`` (the same tasks, in the same order).

    Raises:
        ValueError: ``a`` and ``b`` of different lengths, or what ``bootstrap_mean`` raises.
    """
    if len(a) != len(b):
        raise ValueError(f"paired_difference: expected two lists of one length, got {len(a)} and {len(b)}")
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    return bootstrap_mean(diff.tolist(), samples, seed, confidence)


def subsets(groups: Sequence[str]) -> list[frozenset[str]]:
    """Every subset of ``groups``: subset ``m`` holds ``groups[i]`` when bit ``i`` of ``m`` is set
    (so the empty set comes first and the full set last)."""
    return [frozenset(g for i, g in enumerate(groups) if m >> i & 1) for m in range(1 << len(groups))]


def ties_at_best(scores: Mapping[K, float], tolerance: float = TIE_TOLERANCE) -> list[K]:
    """The keys whose score is within ``tolerance`` of the best, in the mapping's order.

    Raises:
        ValueError: no scores, or a score that is not finite.
    """
    if not scores:
        raise ValueError("ties_at_best: expected at least one score, got none")
    bad = [k for k, v in scores.items() if not math.isfinite(v)]
    if bad:
        raise ValueError(f"ties_at_best: expected finite scores, got {[scores[k] for k in bad[:3]]}")
    best = max(scores.values())
    return [k for k, v in scores.items() if v >= best - tolerance]


def objective_value(eff: float, objective: str) -> float:
    """``log s`` (``log_speedup``) or ``max(0, log s)`` (``reward``) of an effective speedup ``s``.

    ``s`` is 1.0 for a wrong candidate (the original is kept), so ``max(0, log s)`` is exactly
    ``rewards.reward`` of the outcome and both objectives are functions of ``s`` alone.

    >>> objective_value(0.5, "reward"), round(objective_value(0.5, "log_speedup"), 4)
    (0.0, -0.6931)
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective: expected one of {list(OBJECTIVES)}, got {objective!r}")
    log = math.log(max(eff, _FLOOR))
    return log if objective == "log_speedup" else max(0.0, log)


@dataclass
class SubsetMatrix:
    """Per (task, subset of groups) cell: what a rewriter reached when shown that subset.

    Attributes:
        tasks: task ids, one per row.
        columns: the subsets, one per column (``subsets(groups)``: the empty one first).
        eff: (tasks, columns) effective speedups; nan where the chosen action has no recorded outcome.
        actions: the action chosen per cell.
        passes: (tasks, columns) recorded profiling passes of collecting the column's groups.
    """

    tasks: list[str]
    columns: list[frozenset[str]]
    eff: np.ndarray
    actions: list[list[str]]
    passes: np.ndarray
    index: dict[frozenset[str], int] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.index = {s: j for j, s in enumerate(self.columns)}
        if self.eff.shape != (len(self.tasks), len(self.columns)) or self.passes.shape != self.eff.shape:
            raise ValueError(
                f"SubsetMatrix: expected eff and passes of shape {(len(self.tasks), len(self.columns))}, "
                f"got {self.eff.shape} and {self.passes.shape}"
            )

    def values(self, objective: str) -> np.ndarray:
        """``objective_value`` of every cell (nan stays nan)."""
        v = np.log(np.maximum(self.eff, _FLOOR))
        if objective not in OBJECTIVES:
            raise ValueError(f"objective: expected one of {list(OBJECTIVES)}, got {objective!r}")
        return v if objective == "log_speedup" else np.maximum(v, 0.0)

    def sizes(self) -> np.ndarray:
        """The number of groups of each column."""
        return np.array([len(s) for s in self.columns])


@dataclass(frozen=True)
class Choice:
    """The columns tied at the best training mean and their value on other rows.

    Attributes:
        eligible: how many of the offered columns were answered on every training row.
        ties: the tied columns (indices into the matrix), in column order.
        train_score: their training mean.
        held_out: per held-out row, the mean over the ties (nan where some tie is unanswered).
    """

    eligible: int
    ties: tuple[int, ...]
    train_score: float
    held_out: np.ndarray


def choose_on_train(
    values: np.ndarray, columns: Sequence[int], train: Sequence[int], held: Sequence[int]
) -> Choice | None:
    """Among ``columns``, those answered on every ``train`` row with the best mean there (all ties), and
    per ``held`` row the mean over them; ``None`` when no column is answered on every training row.

    ``values`` is (rows, columns) with nan for an unanswered cell (``SubsetMatrix.values``); only the
    ``train`` rows decide, so a choice scored on ``held`` rows is out of sample for them.
    """
    train, held = list(train), list(held)
    if not train:
        raise ValueError("choose_on_train: expected at least one training row, got none")
    eligible = [int(j) for j in columns if not np.isnan(values[train, j]).any()]
    if not eligible:
        return None
    ties = ties_at_best({j: float(values[train, j].mean()) for j in eligible})
    sub = values[np.ix_(held, ties)]
    held_out = np.full(len(held), np.nan)
    ok = ~np.isnan(sub).any(axis=1)
    held_out[ok] = sub[ok].mean(axis=1)
    return Choice(len(eligible), tuple(ties), float(values[train, ties[0]].mean()), held_out)
