"""Write the paper-shaped seed trees ``trees/seed.json`` (ncu) and ``trees/seed_torch.json`` (torch.profiler).

Run: ``python trees/make_seeds.py`` (rewrites both files; ``--check`` only compares them).

Both trees have the same shape (thresholds and reasons in ``trees/README.md``)::

    n0  memory-side feature > M ?   -> leaf memory
    n1  compute-side feature > C ?  -> leaf compute
    n2  latency feature (SM throughput low / launch-overhead share high) ? -> leaf latency, else algorithm

Each leaf holds one of the paper's four fixed configurations (``CONFIGURATIONS``); the vocabulary is the
whole catalog of the tree's source, so the learner can REWRITE a leaf with any group.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autoprofiler.profiling.groups import CONFIGURATIONS, GROUPS, ROOT_GROUP, TORCH_ROOT_GROUP
from autoprofiler.tree import export_text, load_tree, vocabulary_from_catalog

HERE = Path(__file__).resolve().parent

# Per seed: n0, n1, n2 as (feature, threshold, groups to collect, left child, right child).
SEEDS = {
    "seed.json": {
        "source": "ncu",
        "prefix": "",
        "n0": ("dram__throughput.avg.pct_of_peak_sustained_elapsed", 60.0, [ROOT_GROUP], "n1", "memory"),
        "n1": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", 60.0, [ROOT_GROUP], "n2", "compute"),
        "n2": (
            "sm__throughput.avg.pct_of_peak_sustained_elapsed",
            30.0,
            [ROOT_GROUP],
            "latency",
            "algorithm",
        ),
        # 4 groups per leaf (a configuration is 3: one REWRITE fits); passes: see README.
        "budget": {"max_depth": 4, "max_groups_per_leaf": 4, "max_passes_per_task": 80},
    },
    "seed_torch.json": {
        "source": "torch",
        "prefix": "torch_",
        # shares are fractions in [0, 1]
        "n0": ("torch__elementwise_time_share", 0.5, [TORCH_ROOT_GROUP], "n1", "memory"),
        "n1": ("torch__matmul_time_share", 0.5, [TORCH_ROOT_GROUP], "n2", "compute"),
        "n2": ("torch__launch_overhead_share", 0.25, ["torch_launch"], "algorithm", "latency"),
        "budget": {"max_depth": 4, "max_groups_per_leaf": 4, "max_passes_per_task": None},
    },
}


def seed_tree(name: str) -> dict:
    """The JSON form of one seed tree."""
    spec = SEEDS[name]
    source, prefix = spec["source"], spec["prefix"]
    vocabulary = vocabulary_from_catalog([g for g, group in GROUPS.items() if group.source == source], GROUPS)
    for group in vocabulary.values():
        group["passes"] = None  # taken from the catalog (measured on the H200) when the tree is loaded

    def split(node_id):
        feature, threshold, groups, left, right = spec[node_id]
        return {
            "id": node_id,
            "type": "split",
            "feature": feature,
            "threshold": threshold,
            "groups": groups,
            "children": {"left": left, "right": right},
        }

    def leaf(regime):
        configuration = f"{prefix}{regime}"
        return {
            "id": regime,
            "type": "leaf",
            "groups": list(CONFIGURATIONS[configuration]),
            "label": configuration,
        }

    return {
        "schema_version": 1,
        "source": source,
        "vocabulary": vocabulary,
        "budget": spec["budget"],
        "provenance": {
            "name": name.removesuffix(".json"),
            "kind": "hand-written seed (paper shape: latency/memory/compute/algorithm regimes)",
            "made_by": "python trees/make_seeds.py",
            "rationale": "trees/README.md",
            "paper": "arXiv 2610.36576",
        },
        "nodes": [
            split("n0"),
            split("n1"),
            split("n2"),
            leaf("latency"),
            leaf("algorithm"),
            leaf("compute"),
            leaf("memory"),
        ],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check the files are up to date")
    args = parser.parse_args(argv)
    stale = []
    for name in SEEDS:
        tree = load_tree(seed_tree(name), catalog=GROUPS)  # validates
        path = HERE / name
        text = json.dumps(seed_tree(name), indent=2) + "\n"
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
            continue
        path.write_text(text)
        print(f"wrote {path}\n{export_text(tree)}")
    if stale:
        print(f"out of date: {', '.join(stale)} (run: python trees/make_seeds.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
