"""What ``route`` and ``optimize`` share: the tree options, loading the tree and resolving source,
device and size against it, loading the tasks of a file/folder/table, and the live profiler."""

from __future__ import annotations

import sys

from autoprofiler.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_ENVIRONMENT,
    _resolve_device,
    _Stop,
    _task_size,
    add_size_option,
)

_SEED_TREES = {"ncu": "seed.json", "torch": "seed_torch.json"}  # under trees/ at the repository root


def _add_tree_options(p) -> None:
    p.add_argument(
        "--tree",
        default=None,
        help="profiling tree JSON (default: trees/seed_torch.json, or trees/seed.json with --source ncu)",
    )
    p.add_argument(
        "--source",
        choices=("ncu", "torch"),
        default=None,
        help="profile source (default: the tree's; torch when no --tree is given)",
    )
    p.add_argument("--device", default="auto", help="cpu | cuda | cuda:N | auto (cuda when available)")
    add_size_option(p)
    p.add_argument("--cache", default=None, help="profile cache folder (Parquet); default: no cache")
    p.add_argument(
        "--filter",
        default=None,
        metavar="NAMES",
        help="with a folder: only these tasks (comma-separated ids or id suffixes: relu,l2/swish_chain)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def _resolve_tree_setup(args) -> dict:
    """Load the tree (validated against the catalog) and resolve source, device and size."""
    from pathlib import Path

    from autoprofiler.profiling.groups import GROUPS
    from autoprofiler.tree import TreeError, load_tree

    source = args.source
    if args.tree is None:
        source = source or "torch"
        path = Path(__file__).resolve().parents[2] / "trees" / _SEED_TREES[source]
    else:
        path = Path(args.tree)
    try:
        tree = load_tree(path, catalog=GROUPS)
    except (TreeError, OSError) as exc:
        raise _Stop(EXIT_BAD_INPUT, f"tree {str(path)!r} does not load: {exc}") from None
    source = source or tree.source
    if tree.source != source:
        raise _Stop(
            EXIT_BAD_INPUT, f"--tree {path} routes on {tree.source!r} features but --source is {source!r}"
        )
    device = _resolve_device(args.device)
    if source == "ncu" and not device.startswith("cuda"):
        raise _Stop(EXIT_ENVIRONMENT, f"the ncu source needs a CUDA device, got --device {device}")
    size = _task_size(args.size, device)
    try:  # the shipped default, shown as a user would type it
        shown = str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        shown = str(path)
    return {"tree": tree, "tree_path": shown, "source": source, "device": device, "size": size}


def _load_cli_tasks(spec: str, names: str | None = None) -> list:
    """The tasks of a file, folder or table; ``names``: comma-separated ids or id suffixes to keep."""
    from autoprofiler.tasks import TaskLoadError
    from autoprofiler.workflow import select_tasks

    wanted = [n.strip() for n in (names or "").split(",") if n.strip()]
    try:
        tasks, report, unmatched = select_tasks(spec, wanted)
    except TaskLoadError as exc:
        raise _Stop(EXIT_BAD_INPUT, f"tasks {spec!r} do not load: {' '.join(str(exc).split())}") from None
    for error in report.errors:
        print(f"warning: skipped {error}", file=sys.stderr)
    if unmatched:
        raise _Stop(EXIT_BAD_INPUT, f"--filter: {', '.join(unmatched)} match no task in {spec}")
    if not tasks:
        raise _Stop(EXIT_BAD_INPUT, f"no task loaded from {spec!r}")
    return tasks


def _make_profiler(setup: dict, cache: str | None):
    from autoprofiler.profiling import Profiler

    kwargs = {"source": setup["source"], "device": setup["device"], "task_size": setup["size"]}
    if cache:
        from autoprofiler.profiling.cache import ProfileCache

        kwargs["cache"] = ProfileCache(cache)
    try:
        return Profiler(**kwargs)
    except ValueError as exc:  # a bad --device and the like
        raise _Stop(EXIT_BAD_INPUT, str(exc)) from None


def _environment_errors() -> tuple[type, ...]:
    """Profiler errors that stop the whole command (no ncu, no counter permission): exit 3."""
    from autoprofiler.profiling import CountersNotPermitted, NcuNotFound

    return (NcuNotFound, CountersNotPermitted)
