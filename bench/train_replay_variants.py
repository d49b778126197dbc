"""Replay training on a recording under several learner settings; prints one Markdown table.

    python bench/train_replay_variants.py datasets/h200_suite > bench/results/train_h200_replay_variants.md

Each row is one ``workflows/train.py`` run (replay environment, ncu source, the four fixed
configurations as probes, every recorded task), differing only in the starting tree and the
``learn.*`` settings named in the row. They reach train.py as a ``--config`` file holding
train.yaml's ``learn`` section with those settings changed (a dotted override may only name a key
that section lists, and ``selection_fraction`` is not one). Columns: decisions and accepts, the
decision with the highest lower confidence bound (its mean paired gain, LCB and number of acceptance
tasks), and the held-out geomean speedups of the learned tree, the best static configuration chosen
on train, and the oracle.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SHIPPED_LEARN = yaml.safe_load((ROOT / "workflows" / "train.yaml").read_text())["learn"]

LOG_SPEEDUP_SAME_TASKS = ["learn.objective=log_speedup", "learn.selection_fraction=0"]
VARIANTS = [  # (starting tree as a train.py override value, extra overrides); "lone:" is quoted for YAML
    ("trees/seed.json", []),
    ("trees/seed.json", ["learn.selection_fraction=0"]),
    ("trees/seed.json", ["learn.objective=log_speedup"]),
    ("lone:root", []),
    ("lone:root", ["learn.selection_fraction=0"]),
    ("lone:root", ["learn.objective=log_speedup"]),
    ("lone:root", LOG_SPEEDUP_SAME_TASKS),
    ("lone:root", [*LOG_SPEEDUP_SAME_TASKS, "learn.error_control=decision"]),
    ('"lone:"', ["learn.max_rewrite_candidates=4"]),
]


def run(tables: str, tasks: str, tree: str, extra: list[str], out: Path) -> dict:
    learn = dict(SHIPPED_LEARN)
    for setting in extra:
        key, value = setting.split("=", 1)
        learn[key.removeprefix("learn.")] = yaml.safe_load(value)
    config = out.with_suffix(".yaml")
    config.write_text(yaml.safe_dump({"learn": learn}))
    cmd = [
        sys.executable,
        str(ROOT / "workflows" / "train.py"),
        "environment=replay",
        f"tables={tables}",
        f"tasks={tasks}",
        "source=ncu",
        f"tree={tree}",
        "probe=[algorithm, memory, latency, compute]",
        "task_filter=[]",
        "max_tasks=0",
        f"out_dir={out}",
        "--config",
        str(config),
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True)
    decisions = [json.loads(line) for line in (out / "proposals.jsonl").read_text().splitlines()]
    summary = json.loads((out / "evaluation.json").read_text())
    tested = [d for d in decisions if d["stats"] is not None]
    best = max(tested, key=lambda d: d["stats"]["lcb"]) if tested else None
    geo = {k: v["geomean_speedup"] for k, v in summary["summary"].items()}
    static = summary["best_static_on_train"]
    return {
        "decisions": len(decisions),
        "accepted": sum(d["accepted"] for d in decisions),
        "best": best,
        "learned": geo["learned_tree"],
        "static": (static, geo[f"static:{static}"]),
        "oracle": geo["oracle"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tables", help="a recording: profiles/ and rewards/ (e.g. datasets/h200_suite)")
    ap.add_argument("--tasks", default="datasets/suite", help="its task source (the suite)")
    args = ap.parse_args()
    print(f"# Replay training on `{args.tables}` under several learner settings\n")
    print(f"`python bench/train_replay_variants.py {args.tables}`\n")
    print(
        "| start | settings | decisions | accepted | highest-LCB decision | mean gain | LCB | n "
        "| held-out learned | best static (train) | oracle |"
    )
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for i, (tree, extra) in enumerate(VARIANTS):
            r = run(args.tables, args.tasks, tree, extra, Path(tmp) / str(i))
            b = r["best"]
            stats = (
                (b["description"], f"{b['stats']['mean']:.4f}", f"{b['stats']['lcb']:.4f}", b["stats"]["n"])
                if b
                else ("-", "", "", "")
            )
            start = tree.strip('"')
            print(
                f"| {start} | {' '.join(extra) or 'defaults'} | {r['decisions']} | "
                f"{r['accepted']} | {stats[0]} | {stats[1]} | {stats[2]} | {stats[3]} | "
                f"{r['learned']:.3f} | {r['static'][0]} {r['static'][1]:.3f} | {r['oracle']:.3f} |"
            )


if __name__ == "__main__":
    main()
