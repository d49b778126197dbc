"""False accepts of the learner under the null (no configuration helps), per decision and per run.

    python bench/null_false_accept.py --runs 150    # ~20 s on 2 CPUs; prints three Markdown tables

Rewards of candidate and incumbent are independent draws from one zero-inflated distribution (the null
environment of tests/test_learning.py, reused here so the benchmark and the test measure the same thing;
run ``i`` draws from seed ``i``, so every count is reproducible). Tables:

1. the paired test alone (t and bootstrap bound, sign-flip guard included) at several sample sizes;
2. the whole learner loop, per-decision control (``error_control=decision``, the paper's) against
   run-level control (``error_control=run``, the default): tested decisions, accepted ones, and runs
   that accepted any edit (with a 95% Clopper-Pearson interval), at the settings of the CPU test
   (confidence 0.9, max_decisions 6) and at ``LearnConfig``'s defaults (confidence 0.95,
   max_decisions 100), each with ``selection_fraction`` 0.5 (proposer and acceptance test see disjoint
   halves of the training tasks) and 0 (the paper's literal protocol);
3. what run-level control costs: a real effect (showing ``torch_launch`` adds ``delta`` to every
   reward; ``delta`` 0 is the null again) and the share of runs whose learned tree shows
   ``torch_launch`` to some task, at confidence 0.9 and max_decisions 6.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from scipy import stats  # noqa: E402
from test_learning import (  # noqa: E402
    GROUP_NAMES,
    PROBES,
    NullEnvironment,
    _null_reward,
    _null_runs,
    lone_leaf_tree,
)

from autoprofiler.cells import RewardRow  # noqa: E402
from autoprofiler.learning import LearnConfig, Learner, StatisticalProposer, paired_test  # noqa: E402
from autoprofiler.profiling.groups import GROUPS  # noqa: E402
from autoprofiler.tasks import Task  # noqa: E402


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Two-sided exact binomial interval for k successes in n trials."""
    tail = (1 - confidence) / 2
    lo = 0.0 if k == 0 else float(stats.beta.ppf(tail, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - tail, k + 1, n - k))
    return lo, hi


def paired_rows(paired_runs: int, alpha: float) -> None:
    print(f"## The paired test alone (level {alpha}, guard included)\n")
    print("| test | n | tests | accepted | rate |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for method, n in [("t", 6), ("t", 20), ("t", 60), ("bootstrap", 6), ("bootstrap", 20), ("bootstrap", 60)]:
        rng = random.Random(1234 + n)
        runs = paired_runs if method == "t" else paired_runs // 4
        acc = sum(
            paired_test(
                [_null_reward(rng) - _null_reward(rng) for _ in range(n)],
                method,
                confidence=1 - alpha,
                bootstrap_samples=400,
                seed=i,
            ).accepted
            for i in range(runs)
        )
        print(f"| {method} | {n} | {runs} | {acc} | {acc / runs:.3f} |")


def learner_rows(runs: int) -> None:
    print(f"\n## The learner loop under the null ({runs} runs per row, 24 tasks, lone leaf)\n")
    print(
        "| confidence, max_decisions | selection_fraction | error_control | level per decision "
        "| decisions | accepted | rate per decision | runs accepting any | rate per run (95% CI) |"
    )
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for confidence, max_decisions in [(0.9, 6), (0.95, 100)]:
        for fraction in (0.5, 0.0):
            for control in ("decision", "run"):
                settings = {
                    "confidence": confidence,
                    "max_decisions": max_decisions,
                    "selection_fraction": fraction,
                    "error_control": control,
                }
                level = LearnConfig(**settings).level()
                decided, accepted, accepting = _null_runs(runs, **settings)
                lo, hi = clopper_pearson(accepting, runs)
                print(
                    f"| {confidence}, {max_decisions} | {fraction} | {control} | {level:.4g} | {decided} "
                    f"| {accepted} | {accepted / decided:.3f} | {accepting} "
                    f"| {accepting / runs:.3f} ({lo:.3f}-{hi:.3f}) |"
                )


class SignalEnvironment(NullEnvironment):
    """The null, except that a configuration showing ``torch_launch`` adds ``delta`` to every reward."""

    def __init__(self, run: int, delta: float):
        super().__init__(run)
        self.delta = delta

    def row(self, cell):
        base = super().row(cell)
        r = base.reward + (self.delta if "torch_launch" in cell.groups else 0.0)
        return RewardRow.build(cell, correct=r > 0, speedup=math.exp(r))


def power_rows(runs: int) -> None:
    print(f"\n## What run-level control costs: a real effect ({runs} runs per row)\n")
    print("| delta | error_control | level per decision | runs whose tree shows torch_launch |")
    print("| ---: | --- | ---: | ---: |")
    tasks = [Task.from_source(f"null/{i}", f"# null task {i}") for i in range(24)]
    for delta in (0.0, 0.1, 0.2, 0.4):
        for control in ("decision", "run"):
            config = LearnConfig(confidence=0.9, min_tasks=3, max_decisions=6, error_control=control)
            found = 0
            for run in range(runs):
                learner = Learner(
                    SignalEnvironment(run, delta),
                    tasks,
                    StatisticalProposer(),
                    config,
                    catalog=GROUPS,
                    probe_configurations=PROBES,
                    groups=GROUP_NAMES,
                )
                tree = learner.fit(lone_leaf_tree())
                found += any("torch_launch" in tree.leaf(leaf).groups for leaf in tree.leaf_ids)
            print(f"| {delta} | {control} | {config.level():.4g} | {found}/{runs} = {found / runs:.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=150, help="learner runs per row")
    p.add_argument("--paired-runs", type=int, default=1500, help="paired tests per row")
    args = p.parse_args()
    import logging

    logging.disable(logging.WARNING)  # the selection_fraction=0 rows warn once per run, by design
    paired_rows(args.paired_runs, 0.1)
    learner_rows(args.runs)
    power_rows(args.runs)


if __name__ == "__main__":
    main()
