"""The learner's acceptance test: a one-sided paired test on per-task reward gains.

A candidate tree is compared with the incumbent on the same tasks, so the unit of evidence is the
per-task gain (candidate minus incumbent). ``paired_test`` accepts when both hold:

- a lower confidence bound (LCB) of the mean gain exceeds a margin (the Student t bound by default, or a
  percentile bootstrap): the effect-size requirement;
- the sign-flip p-value of "no gain" (``sign_flip_p_value``: exact up to ``EXACT_SIGN_FLIP_MAX``
  non-zero gains, a valid bound a few percent above it beyond) is at most the level ``1 - confidence``:
  the validity guard.

Why the guard: the t bound is ``mean - t * sd / sqrt(n)``, so gains with no spread (``[0.3, 0.3, 0.3]``,
what a deterministic replay gives when one edit changes a few tasks the same way) have ``LCB = mean``
and were accepted with certainty from three tasks; tiny spread is almost as bad. Under the null the
learner controls (candidate and incumbent rewards exchangeable per task) every gain is symmetric about
zero, so flipping signs gives the exact null distribution of the sum whatever the distribution of the
gains, zeros and ties included: the guard's false-accept rate is at most the level for any sample size,
and ``m`` non-zero gains can give no p-value below ``2**-m`` (three tasks: 1/8, never certainty). A
variance floor was the alternative, but the learner has no measured noise floor for a replay (one
evaluation per cell), and a wrong floor either brings certainty back or removes all power.

Example:
    >>> paired_test([0.4, 0.3, 0.5, 0.35, 0.45]).accepted
    True
    >>> paired_test([0.3, 0.3, 0.3], confidence=0.9).accepted   # p = 1/8 > 0.1
    False
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["METHODS", "PairedTest", "paired_test", "sign_flip_p_value"]

#: How the lower confidence bound is computed (``paired_test(method=...)``).
METHODS = ("t", "bootstrap")

#: Up to this many non-zero gains the sign-flip p-value is exact (2**m sign patterns, counted by meeting
#: in the middle: two tables of 2**(m/2) sums); above it, an upper bound a few percent above it where
#: p >= 1e-4 (``_sign_flip_tail_on_a_grid``; tests/test_learning.py holds it within 10% of the exact count).
EXACT_SIGN_FLIP_MAX = 20
#: Grid cells per non-zero gain in that bound, and their range: its slack is about ``1.7 m / cells``
#: standard deviations of the sum (under 0.01 up to 256 gains, 0.03 at 1000) for ``m * cells`` steps of work.
GRID_CELLS_PER_GAIN, GRID_CELLS_RANGE = 256, (2**12, 2**16)
#: What the rounding remainder may add to the bound (Hoeffding), so the bound stays a bound.
GRID_SLACK = 1e-12


@dataclass(frozen=True)
class PairedTest:
    """The outcome of one paired test on per-task reward gains (candidate minus incumbent).

    ``lcb`` is the one-sided lower confidence bound of the mean gain at ``confidence``; ``p_value`` the
    method's p-value of "mean gain <= margin" (None where it is undefined: a t test on gains without
    spread); ``p_sign_flip`` the exact sign-flip p-value of "no gain" over the ``nonzero`` non-zero gains;
    ``accepted`` is ``n >= min_tasks and lcb > margin and p_sign_flip <= 1 - confidence``; ``reason``
    says why in words.
    """

    n: int
    mean: float
    sd: float
    lcb: float
    p_value: float | None
    p_sign_flip: float
    nonzero: int
    method: str
    confidence: float
    margin: float
    min_tasks: int
    accepted: bool
    reason: str

    def as_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values (a non-finite number becomes ``None``)."""
        return {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in dataclasses.asdict(self).items()
        }


def sign_flip_p_value(gains: Sequence[float]) -> float:
    """One-sided p-value of "no gain" by flipping signs: the share of sign patterns reaching the observed sum.

    Under the null every gain is symmetric about zero, so given the absolute values each of the ``2**m``
    sign patterns of the ``m`` non-zero gains is equally likely (zeros contribute nothing either way;
    a gain below 1e-12 of the largest in size counts as zero: float noise between equal rewards);
    the share of patterns whose sum reaches the observed sum is an exact p-value (``P(p <= u) <= u``).
    Exact up to ``EXACT_SIGN_FLIP_MAX`` non-zero gains; above, an upper bound of it (so still valid) that
    is off by a small fraction of a standard deviation of the sum. Near-ties (within 1e-12 of the scale)
    count as reaching the sum, which only raises p.

    Example:
        >>> sign_flip_p_value([0.3, 0.3, 0.3]), sign_flip_p_value([0.0, 0.0]), sign_flip_p_value([1.0, -1.0])
        (0.125, 1.0, 0.75)
    """
    import numpy as np  # lazy: keeps module import light

    g = _nonzero(gains)
    m = int(g.size)
    if m == 0:
        return 1.0
    a, total = np.abs(g), float(g.sum())
    threshold = total - 1e-12 * float(a.sum())
    if m > EXACT_SIGN_FLIP_MAX:
        return _sign_flip_tail_on_a_grid(a, threshold)

    def sums(values):  # every signed sum of ``values``: 2**len(values) numbers
        out = np.zeros(1)
        for v in values:
            out = np.concatenate([out - v, out + v])
        return out

    half = m // 2
    left, right = sums(a[:half]), np.sort(sums(a[half:]))
    below = np.searchsorted(right, threshold - left, side="left")  # right sums that fall short, per left
    reaching = left.size * right.size - int(below.sum())
    return reaching / float(2**m)


def _nonzero(gains: Sequence[float]):
    """The gains that are not zero: above 1e-12 of the largest in size (float noise of equal rewards is 0)."""
    import numpy as np

    g = np.asarray(list(gains), dtype=float)
    scale = float(np.abs(g).max()) if g.size else 0.0
    return g[np.abs(g) > 1e-12 * scale]


def _sign_flip_tail_on_a_grid(a, threshold: float) -> float:
    """An upper bound on ``P(sum_i s_i a_i >= threshold)`` over independent fair signs ``s_i``.

    Each ``a_i`` is rounded to ``k_i * h`` on a grid of ``cells`` cells over ``sum(a)`` (``m *
    GRID_CELLS_PER_GAIN`` within ``GRID_CELLS_RANGE``); the law of ``sum s_i k_i`` is computed exactly
    (a convolution of two-point laws, about ``m * cells`` steps).
    The remainders ``r_i = a_i - k_i h`` add ``sum s_i r_i``, which exceeds ``delta`` with probability at
    most ``exp(-delta**2 / (2 sum r_i**2)) = GRID_SLACK`` (Hoeffding), so
    ``P(sum s a >= t) <= P(h sum s k >= t - delta) + GRID_SLACK``. ``delta`` is a few grid steps times
    ``sqrt(m)``: a small fraction of the sum's standard deviation (``GRID_CELLS_PER_GAIN``).
    """
    import numpy as np

    low, high = GRID_CELLS_RANGE
    h = float(a.sum()) / min(high, max(low, GRID_CELLS_PER_GAIN * a.size))
    k = np.rint(a / h).astype(np.int64)
    r = a - k * h
    delta = math.sqrt(2.0 * float((r**2).sum()) * math.log(1.0 / GRID_SLACK))
    law, reach = np.ones(1), 0  # law[reach + s] = P(sum of the signed steps so far = s)
    for step in np.sort(k[k > 0]):  # small steps first: the support grows slowly
        wider = np.zeros(law.size + 2 * step)
        wider[: law.size] += law  # this sign -1
        wider[2 * step :] += law  # this sign +1
        law, reach = 0.5 * wider, reach + int(step)
    first = max(0, reach + math.ceil((threshold - delta) / h))
    return min(1.0, float(law[first:].sum()) + GRID_SLACK)


def paired_test(
    gains: Sequence[float],
    method: str = "t",
    confidence: float = 0.95,
    margin: float = 0.0,
    min_tasks: int = 3,
    bootstrap_samples: int = 2000,
    seed: int = 0,
) -> PairedTest:
    """One-sided test that the mean paired gain exceeds ``margin``, guarded by the exact sign-flip test.

    Args:
        gains: per-task reward differences, candidate minus incumbent (the affected tasks only).
        method: ``"t"`` (Student t lower bound: mean - t_{c,n-1} * sd / sqrt(n)) or ``"bootstrap"``
            (the (1 - confidence) percentile of ``bootstrap_samples`` resampled means, fixed ``seed``).
        confidence: e.g. 0.95 for a 5% false-accept level under the null of no gain (the learner passes
            the level of the decision: per decision, or a share of the run's level).
        margin: the LCB must exceed this (reward units; 0 means "better at all"). The sign-flip guard
            tests "no gain" itself, so the margin is an effect size on top of it.
        min_tasks: fewer affected tasks than this is a rejection, whatever the numbers.

    Returns: a ``PairedTest``.

    Raises: ``ValueError`` for an unknown ``method`` or a ``confidence`` outside [0.5, 1).

    Measured false-accept rates at confidence 0.9 under a zero-inflated null, guard included, are in
    ``bench/results/null_false_accept_cpu.md`` (``tests/test_learning.py`` holds them to the level);
    the percentile bootstrap's bound is anti-conservative at small n, so ``t`` is the default.

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
    nonzero = int(_nonzero(g).size)
    level = 1.0 - confidence

    def outcome(lcb: float, p_value: float | None, p_flip: float, accepted: bool, reason: str) -> PairedTest:
        return PairedTest(
            n=n,
            mean=mean,
            sd=sd,
            lcb=lcb,
            p_value=p_value,
            p_sign_flip=p_flip,
            nonzero=nonzero,
            method=method,
            confidence=confidence,
            margin=margin,
            min_tasks=min_tasks,
            accepted=accepted,
            reason=reason,
        )

    if n < max(1, min_tasks) or n < 2:
        return outcome(-math.inf, None, 1.0, False, f"only {n} affected task(s) < min_tasks {min_tasks}")
    p_value: float | None
    if method == "t":
        from scipy import stats

        if sd == 0.0:  # no spread, no t statistic: the bound degenerates to the mean; the guard decides
            lcb, p_value = mean, None
        else:
            se = sd / math.sqrt(n)
            lcb = mean - float(stats.t.ppf(confidence, n - 1)) * se
            p_value = float(stats.t.sf((mean - margin) / se, n - 1))
    else:
        rng = np.random.default_rng(seed)
        means = g[rng.integers(0, n, size=(bootstrap_samples, n))].mean(axis=1)
        lcb = float(np.quantile(means, 1.0 - confidence))
        p_value = float((means <= margin).mean())
    p_flip = sign_flip_p_value(g.tolist())
    if lcb <= margin:
        reason = f"LCB {lcb:.4f} <= margin {margin:.4f} (mean gain {mean:.4f} over {n} tasks)"
    elif p_flip > level:
        reason = (
            f"LCB {lcb:.4f} > margin {margin:.4f} but sign-flip p {p_flip:.4g} > level {level:.4g} "
            f"({nonzero} of {n} gains non-zero)"
        )
    else:
        reason = f"LCB {lcb:.4f} > margin {margin:.4f}, sign-flip p {p_flip:.4g} <= level {level:.4g}"
    return outcome(lcb, p_value, p_flip, lcb > margin and p_flip <= level, reason)
