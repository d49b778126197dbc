"""For each leaf of a tree over a recording: the mean paired reward gain of showing one more group.

Replay only (no GPU), over the tasks recorded with every group:
    python bench/leaf_group_gains.py datasets/h200_suite --tree trees/seed.json \
        --out bench/results/leaf_group_gains_h200.md
A REWRITE proposal can only be accepted where some gain here is positive.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoprofiler.environments import ReplayEnvironment  # noqa: E402
from autoprofiler.profiling import GROUPS  # noqa: E402
from autoprofiler.rewriters import RuleRewriter  # noqa: E402
from autoprofiler.tasks import load_tasks  # noqa: E402
from autoprofiler.tree import load_tree  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recording")
    p.add_argument("--tree", default=str(ROOT / "trees" / "seed.json"))
    p.add_argument("--tasks", default=str(ROOT / "datasets" / "suite"))
    p.add_argument("--source", default="ncu", choices=("ncu", "torch"))
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)

    env = ReplayEnvironment.from_dir(args.recording, rewriter=RuleRewriter(), source=args.source)
    tree = load_tree(args.tree, catalog=GROUPS)
    groups = [g for g, m in GROUPS.items() if m.source == args.source]
    tasks, _ = env.fully_recorded(load_tasks(args.tasks).tasks)
    by_leaf: dict[str, list] = {}
    for t in tasks:
        by_leaf.setdefault(tree.apply(env.profiler.snapshot(t, groups)), []).append(t)
    lines = [
        f"# Gain of one more group per leaf (`{args.tree}`, `{args.recording}`, replay, {len(tasks)} tasks)",
        "",
        f"`python bench/leaf_group_gains.py {' '.join(argv if argv is not None else sys.argv[1:])}`",
        "",
        "| leaf | tasks | leaf groups | + group | mean reward gain | tasks whose reward changes |",
        "| --- | ---: | --- | --- | ---: | ---: |",
    ]
    for leaf, members in sorted(by_leaf.items()):
        base = sorted(tree.leaf(leaf).groups)
        before = [env.outcome(t, "+".join(base)).reward for t in members]
        for g in (g for g in groups if g not in base):
            after = [env.outcome(t, "+".join(sorted([*base, g]))).reward for t in members]
            diff = [b - a for a, b in zip(before, after, strict=True)]
            lines.append(
                f"| {leaf} | {len(members)} | {'+'.join(base)} | {g} | {sum(diff) / len(diff):+.4f} | "
                f"{sum(d != 0 for d in diff)} |"
            )
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
