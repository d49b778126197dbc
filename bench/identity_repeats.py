"""Repeated evaluations of near-identity playbook candidates at the CPU test settings: how often one is
not judged correct, and the spread of its speedup.

    python bench/identity_repeats.py --rounds 100

``sdpa`` and ``cudnn_benchmark`` on ``l1/relu`` leave the forward as it is (a speedup of 1.0 is the
truth); ``sdpa`` on ``l2/attention_naive`` is a real rewrite, for contrast. The settings are those of
``tests/test_playbook.py::test_actions_pass_the_evaluator_on_cpu`` (5 timing trials, 1 warm-up), where
a fresh-page fault on a few timed calls decides the median. Prints one line per case.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoprofiler.evaluation import EvalConfig, Evaluator  # noqa: E402
from autoprofiler.rewriters import PlaybookRewriter  # noqa: E402
from autoprofiler.tasks import load_task_file  # noqa: E402

CASES = [("l1/relu", "sdpa"), ("l1/relu", "cudnn_benchmark"), ("l2/attention_naive", "sdpa")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=100, help="evaluations of each case")
    p.add_argument("--trials", type=int, default=5, help="timing trials per evaluation")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.trials < 1:
        print("error: --rounds and --trials must be >= 1", file=sys.stderr)
        return 2
    config = EvalConfig(
        device="cpu", task_size="small", correctness_trials=2, timing_trials=args.trials, warmup=1
    )
    failed: collections.Counter = collections.Counter()
    speedups: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    tasks = {rel: load_task_file(ROOT / "datasets" / "suite" / f"{rel}.py") for rel, _ in CASES}
    t0 = time.monotonic()
    with Evaluator(config, spares=2) as evaluator:
        for _ in range(args.rounds):
            for rel, action in CASES:
                task = tasks[rel]
                r = evaluator.evaluate(task, PlaybookRewriter().source_for(task, action))
                if not r.correct:
                    failed[(rel, action, r.error_kind)] += 1
                elif r.ref_ms and r.new_ms:
                    speedups[(rel, action)].append(r.ref_ms / r.new_ms)
    seconds = time.monotonic() - t0
    print(f"{args.rounds * len(CASES)} evaluations in {seconds:.1f} s; not correct: {dict(failed)}")
    print("| task | action | correct | median speedup | min | max | outside 0.8-1.25 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (rel, action), xs in speedups.items():
        outside = sum(1 for x in xs if not 0.8 <= x <= 1.25)
        print(
            f"| {rel} | {action} | {len(xs)}/{args.rounds} | {statistics.median(xs):.3f} | {min(xs):.3f} "
            f"| {max(xs):.3f} | {outside} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
