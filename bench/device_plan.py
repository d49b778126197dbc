"""What issue 11 still needs from a device call on a given card: one step per line, in the order to run.

    python3 bench/device_plan.py "NVIDIA H200"         # e.g. "record<TAB>259 of 300 H200 tasks complete ..."
    python3 bench/device_plan.py --many-kernel-tasks    # the suite tasks profiled in range replay

A device call is short and rarely lent, so ``bench/device_next.sh`` runs these steps without a person
choosing between them. The steps, for the card the device tool lent:

- ``record`` (``bench/h200_record_generated.sh``): on the H200, while fewer than ``--target`` tasks are
  complete over ``datasets/h200_suite`` and ``datasets/recorded/h200`` (complete: every ncu group
  profiled and every rule-v1 action recorded). On any other card always, last: it finishes the tasks that
  card started and starts new ones only beyond those kept free for the H200.
- ``playbook`` (``bench/h200_record_playbook.sh all``, ``TARGET=generated``): while the card's recording
  lacks a reward row of a cell that playbook-v1 reaches, by the card's committed reachability report.
- ``suite_range`` (``bench/h200_session_d.sh record``, H200 only): while a many-kernel suite task lacks
  an ncu group in ``datasets/h200_suite``.

It reads Parquet with pyarrow (the device's python has no polars) and imports no torch.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import pyarrow.dataset as ds

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/, when imported from elsewhere
from h200_record_playbook import reachable_actions  # noqa: E402  (it puts the repository root on the path)

from autoprofiler.profiling.groups import GROUPS  # noqa: E402
from autoprofiler.rewriters.actions import RULE_ACTIONS  # noqa: E402

#: the ncu groups a complete task has a profile of
NCU_GROUPS = frozenset(name for name, group in GROUPS.items() if group.source == "ncu")
#: the suite tasks whose many kernels ncu profiles in range replay (``bench/h200_session_d.sh record``)
MANY_KERNEL_TASKS = (
    "rowwise_loop_normalize",
    "swish_chain",
    "tiny_elementwise_chain",
    "attention_block",
    "deep_tiny_mlp",
    "embedding_bag_mlp",
    "gru_cell_loop",
    "lstm_sequence",
    "mlp_block",
    "mobilenet_block_fp16",
    "resnet_basic_block",
    "small_cnn",
    "transformer_block_bf16",
)


def card_of(gpu_name: str) -> str | None:
    """``h200`` or ``h100`` for a GPU name as nvidia-smi prints it; None for a card with no recording."""
    for card in ("h200", "h100"):
        if card in gpu_name.lower():
            return card
    return None


def _table(folder: Path, columns: list[str]) -> dict[str, list]:
    if not folder.is_dir():
        return {c: [] for c in columns}
    table = ds.dataset(folder, format="parquet", partitioning="hive").to_table(columns=columns)
    return {c: table.column(c).to_pylist() for c in columns}


def profiled_groups(recording: Path) -> dict[str, set[str]]:
    """``task id -> ncu groups`` the recording holds a profile of."""
    t = _table(recording / "profiles", ["task_id", "group"])
    out: dict[str, set[str]] = defaultdict(set)
    for task_id, group in zip(t["task_id"], t["group"], strict=True):
        out[task_id].add(group)
    return out


def recorded_actions(recording: Path) -> dict[str, set[str]]:
    """``task id -> actions`` the recording holds a rule-v1 action row of (playbook rows included)."""
    t = _table(recording / "rewards", ["task_id", "kind", "rewriter", "action"])
    out: dict[str, set[str]] = defaultdict(set)
    for task_id, kind, rewriter, action in zip(
        t["task_id"], t["kind"], t["rewriter"], t["action"], strict=True
    ):
        if kind == "action" and rewriter == "rule-v1":
            out[task_id].add(action)
    return out


def complete_tasks(recording: Path) -> int:
    """Tasks with every ncu group profiled and every rule-v1 action recorded."""
    groups, actions = profiled_groups(recording), recorded_actions(recording)
    return sum(1 for t, g in groups.items() if NCU_GROUPS <= g and set(RULE_ACTIONS) <= actions.get(t, set()))


def playbook_cells_left(recording: Path, report: Path) -> int:
    """Cells playbook-v1 reaches (by ``report``) that the recording holds no reward row of.

    Raises ValueError (one line) when ``report`` is not a reachability report with playbook-v1."""
    if not report.is_file():
        return 0
    actions = recorded_actions(recording)
    reach = reachable_actions(report, "playbook-v1")
    return sum(len(wanted - actions.get(task_id, set())) for task_id, wanted in reach.items())


def many_kernel_groups_left(suite: Path) -> int:
    """(task, group) profiles the many-kernel suite tasks still lack."""
    groups = profiled_groups(suite)
    by_name = {task_id.rsplit("/", 1)[-1]: g for task_id, g in groups.items()}
    return sum(len(NCU_GROUPS - by_name.get(name, set())) for name in MANY_KERNEL_TASKS)


def plan(card: str, root: Path, target: int = 300) -> list[tuple[str, str]]:
    """``(step, why)`` in the order to run them, for ``card`` (``h200`` or ``h100``)."""
    recording = root / "datasets" / "recorded" / card
    suite = root / "datasets" / "h200_suite"
    steps: list[tuple[str, str]] = []
    if card == "h200":
        done_suite, done_generated = complete_tasks(suite), complete_tasks(recording)
        done = done_suite + done_generated
        if done < target:
            why = f"{done} of {target} H200 tasks complete (suite {done_suite}, generated {done_generated})"
            steps.append(("record", why))
    left = playbook_cells_left(recording, root / "bench" / "results" / f"rewriter_reachability_{card}.json")
    if left:
        steps.append(
            ("playbook", f"{left} reachable playbook cells without a row in {recording.relative_to(root)}")
        )
    if card == "h200":
        missing = many_kernel_groups_left(suite)
        if missing:
            steps.append(("suite_range", f"{missing} group profiles of the many-kernel suite tasks missing"))
    else:
        steps.append(("record", "finish the tasks this card started; new ones beyond the H200's reserve"))
    return steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gpu", nargs="?", help="the GPU's name as nvidia-smi prints it")
    p.add_argument("--root", default=".", help="the repository root")
    p.add_argument("--target", type=int, default=300, help="complete H200 tasks issue 11 asks for")
    p.add_argument("--many-kernel-tasks", action="store_true", help="print the range-replay suite tasks")
    args = p.parse_args(argv)
    if args.many_kernel_tasks:
        print(",".join(MANY_KERNEL_TASKS))
        return 0
    card = card_of(args.gpu or "")
    if card is None:
        print(
            f"error: no recording for the GPU {args.gpu!r} (an H200 or an H100 is expected)", file=sys.stderr
        )
        return 2
    try:
        steps = plan(card, Path(args.root))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for step, why in steps:
        print(f"{step}\t{why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
