"""False-accept rate of the learner's paired acceptance test under the null (no configuration helps).

    python bench/null_false_accept.py --runs 100        # ~1-2 min on 2 CPUs; prints a table

Rewards of candidate and incumbent are independent draws from one zero-inflated distribution (the null
environment of tests/test_learning.py, reused here so the benchmark and the test measure the same thing).
Rows: the paired test alone at several sample sizes, then the whole learner loop, with the default
``selection_fraction=0.5`` (proposer and acceptance test see disjoint halves of the training tasks) and
with ``selection_fraction=0`` (the paper's literal protocol: test on the tasks the proposer ranked on).
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_learning import _null_reward, _null_runs  # noqa: E402

from autoprofiler.learning import paired_test  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=100, help="learner runs per row")
    p.add_argument("--paired-runs", type=int, default=1500, help="paired tests per row")
    args = p.parse_args()
    alpha = 0.1
    print(f"configured level {alpha} (confidence {1 - alpha})\n")
    print(f"{'what':46s} {'decisions':>9s} {'accepted':>8s} {'rate':>6s}")
    for method, n in [("t", 6), ("t", 20), ("t", 60), ("bootstrap", 6), ("bootstrap", 20), ("bootstrap", 60)]:
        rng = random.Random(1234 + n)
        runs = args.paired_runs if method == "t" else args.paired_runs // 4
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
        print(f"{f'paired {method} test, n={n}':46s} {runs:9d} {acc:8d} {acc / runs:6.3f}")
    for label, config in [
        ("learner, selection_fraction=0.5 (default)", {}),
        ("learner, selection_fraction=0", {"selection_fraction": 0.0}),
    ]:
        decided, accepted = _null_runs(args.runs, **config)
        se = math.sqrt(alpha * (1 - alpha) / max(decided, 1))
        print(f"{label:46s} {decided:9d} {accepted:8d} {accepted / decided:6.3f}  (+/- {2 * se:.3f})")


if __name__ == "__main__":
    main()
