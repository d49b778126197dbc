"""A resampled recording: N copies of a recording's fully recorded tasks, as distinct tasks.

    python bench/resample_recording.py --n 6000 --out /tmp/resampled     # ~15 s on 2 CPUs

What ``bench/learner_scale.py`` measures the learner on; written to a temporary folder, never committed.
Each of the N tasks is a copy of one of the tasks the main job replays (``workflows/train.yaml``'s
recordings and task sources: those recorded with every ncu group and every rule action, 205 on
2026-12-05), drawn with replacement with a fixed seed. A copy is a distinct ``Task``: id
``resampled/<original id>/<k>``, source the original's plus a trailing comment ``# resampled copy k of
<original id>`` (so its content hash differs), ``origin`` ``resampled_from=<original id>``, tag
``resampled``. Its profile and reward rows are the original's with the copy's ``task_id`` and
``task_hash``, keys recomputed (``tables.profile_key``, ``rewards.cell_key``) and the run id
``resampled-n<N>-seed<seed>``. Jitter: each reward row's ``ref_ms`` and ``new_ms`` are multiplied by
``exp(jitter * z)``, ``z`` standard normal drawn per row and column from the seed (default jitter 0.02),
and speedup, reward and effective speedup recomputed, so copies are not exact duplicates; a
configuration row takes the outcome of its copy's action row (as in the recording, where they are
equal). Profiles, what trees route on, are copied unchanged. The tables are written with the project's
writers (``ProfileTable``, ``RewardTable``), so the real ``ReplayEnvironment`` reads them.

Copies are pseudo-replicates: statistics over them count each original many times.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
#: the main job's default recordings and task sources (workflows/train.yaml's ``tables`` and ``tasks``)
RECORDINGS = [ROOT / "datasets" / name for name in ("h200_suite", "recorded/h200", "recorded/h100")]
TASK_SOURCES = [ROOT / "datasets" / "suite", ROOT / "datasets" / "ops_gen" / "tasks.parquet"]
SOURCE = "ncu"


#: outcome columns a configuration row shares with the action row its rules chose
OUTCOME = (
    "candidate_hash",
    "compiled",
    "correct",
    "error_kind",
    "error",
    "ref_ms",
    "new_ms",
    "speedup",
    "reward",
    "effective_speedup",
    "eval_seconds",
)


def original_tasks(
    recordings: Sequence[Path] = tuple(RECORDINGS), sources: Sequence[Path] = tuple(TASK_SOURCES)
) -> list:
    """The tasks of ``sources`` that ``recordings`` hold with every group and every rule action: what
    train.py trains and judges on."""
    from autoprofiler.environments import ReplayEnvironment
    from autoprofiler.rewriters import RuleRewriter
    from autoprofiler.tasks import load_tasks

    # the rule rewriter: a task counts only with every rule action's row, as in train.py
    env = ReplayEnvironment(list(recordings), RuleRewriter(), SOURCE, runner=None)
    tasks, _ = env.fully_recorded([t for source in sources for t in load_tasks(source).tasks])
    env.close()
    if not tasks:
        raise ValueError(f"{', '.join(map(str, recordings))}: no task is recorded with every group")
    return tasks


def resampled_tasks(originals: Sequence, n: int, seed: int = 0) -> list[tuple[Any, Any]]:
    """``n`` (copy, original) pairs, the originals drawn with replacement by ``seed``.

    Copy ``k`` of an original (k counts its copies from 0) is ``resampled/<id>/<k>`` with the source
    ``<original source>\\n# resampled copy k of <id>\\n``: the same program under another content hash.
    """
    from autoprofiler.tasks import Task

    rng = random.Random(seed)
    copies: dict[str, int] = {}
    out = []
    for _ in range(n):
        t = originals[rng.randrange(len(originals))]
        k = copies.get(t.id, 0)
        copies[t.id] = k + 1
        source = t.source.rstrip("\n") + f"\n# resampled copy {k} of {t.id}\n"
        copy = Task.from_source(
            f"resampled/{t.id}/{k}", source, t.level, (*t.tags, "resampled"), f"resampled_from={t.id}"
        )
        out.append((copy, t))
    return out


def _jittered(row: dict[str, Any], rng: random.Random, jitter: float) -> dict[str, Any]:
    """``row`` with ref_ms and new_ms each times ``exp(jitter * z)``; speedup and reward recomputed."""
    from autoprofiler import rewards

    out = dict(row)
    for col in ("ref_ms", "new_ms"):
        z = rng.gauss(0.0, 1.0)  # drawn whatever the value, so one row's draws never shift another's
        if out[col] is not None:
            out[col] = out[col] * math.exp(jitter * z)
    if row["speedup"] is not None:
        out["speedup"] = rewards.speedup(out["ref_ms"], out["new_ms"])
    out["reward"] = rewards.reward(out)
    out["effective_speedup"] = rewards.effective_speedup(out)
    return out


def _profile_rows(copy, orig, recorded: dict[str, dict[str, Any]], run_id: str) -> list[dict[str, Any]]:
    """The copy's profile rows: the original's, under the copy's hash, id and recomputed keys."""
    from autoprofiler.tables import profile_key

    out = []
    for group, r in recorded.items():
        where = (r["device"] or "", r["driver"] or "", r["ncu_version"] or "")
        if profile_key(orig.hash, r["source"], group, *where) != r["key"]:
            raise ValueError(f"{orig.id}: profile row {r['key']} is not keyed by tables.profile_key")
        profile = json.loads(r["profile_json"])
        profile["task_hash"] = copy.hash
        out.append(
            {
                **r,
                "key": profile_key(copy.hash, r["source"], group, *where),
                "task_id": copy.id,
                "task_hash": copy.hash,
                "profile_json": json.dumps(profile, sort_keys=True, separators=(",", ":")),
                "run_id": run_id,
            }
        )
    return out


def _reward_rows(
    copy, orig, recorded: list[dict[str, Any]], run_id: str, rng: random.Random, jitter: float
) -> list[dict[str, Any]]:
    """The copy's reward rows: action rows jittered, configuration rows joined to their copied action."""
    from autoprofiler.rewards import cell_key

    def key(task_hash: str, r: dict[str, Any]) -> str:
        action = r["action"] if r["kind"] == "action" else ""
        return cell_key(
            task_hash, r["kind"], r["configuration"], action, r["rewriter"], r["seed"], r["round"]
        )

    actions: dict[tuple[str, int, int], dict[str, Any]] = {}
    out = []
    for r in sorted(recorded, key=lambda r: r["kind"] != "action"):  # action rows first
        if key(orig.hash, r) != r["key"]:
            raise ValueError(f"{orig.id}: reward row {r['key']} is not keyed by rewards.cell_key")
        chosen = (r["action"], r["seed"], r["round"])
        if r["kind"] == "action":
            new = actions[chosen] = _jittered(r, rng, jitter)
        elif chosen in actions:
            new = {**r, **{c: actions[chosen][c] for c in OUTCOME}}
        else:
            raise ValueError(
                f"{orig.id}: configuration row {r['key']} chose {chosen}, which has no action row"
            )
        out.append(
            {**new, "task_id": copy.id, "task_hash": copy.hash, "run_id": run_id, "key": key(copy.hash, r)}
        )
    return out


def write_resampled(
    pairs: Sequence[tuple[Any, Any]],
    out: Path,
    recordings: Sequence[Path] = tuple(RECORDINGS),
    seed: int = 0,
    jitter: float = 0.02,
) -> dict[str, int]:
    """Write the copies' ``profiles/``, ``rewards/`` and ``candidates/`` under ``out`` (module docstring).

    Returns counts: tasks, profile rows, action and configuration reward rows.

    Raises: ``ValueError`` when a recorded row's key is not the one the project's key functions give
    (the copies' keys would then not be where the environment looks).
    """
    from autoprofiler.tables import CANDIDATE_SCHEMA, ParquetTable, ProfileTable, RewardTable

    src_profiles = ProfileTable(None, read_from=[r / "profiles" for r in recordings])
    by_task: dict[str, list[dict[str, Any]]] = {}
    for r in RewardTable(None, read_from=[r / "rewards" for r in recordings]).records():
        by_task.setdefault(r["task_hash"], []).append(r)
    run_id = f"resampled-n{len(pairs)}-seed{seed}"
    whole = 1 << 30  # flush_every: one part per table, written at the end
    profiles = ProfileTable(out / "profiles", flush_every=whole, run_id=run_id, writer="arrow")
    reward_table = RewardTable(out / "rewards", flush_every=whole, run_id=run_id, writer="arrow")
    rng = random.Random(f"jitter:{seed}")
    for copy, orig in pairs:
        profiles.extend(_profile_rows(copy, orig, src_profiles.groups_for(orig.hash, SOURCE), run_id))
        reward_table.extend(_reward_rows(copy, orig, by_task.get(orig.hash, []), run_id, rng, jitter))
    profiles.flush()
    reward_table.flush()
    candidates = ParquetTable(out / "candidates", CANDIDATE_SCHEMA, flush_every=whole, writer="arrow")
    candidates.extend(
        ParquetTable(None, CANDIDATE_SCHEMA, read_from=[r / "candidates" for r in recordings]).records()
    )
    candidates.flush()
    kinds = [r["kind"] for r in reward_table.records()]
    return {
        "tasks": len(pairs),
        "profile_rows": len(profiles),
        "action_rows": kinds.count("action"),
        "configuration_rows": kinds.count("configuration"),
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, required=True, help="resampled task count")
    ap.add_argument("--out", required=True, help="the folder to write profiles/, rewards/, candidates/ to")
    ap.add_argument("--seed", type=int, default=0, help="resampling and jitter seed")
    ap.add_argument("--jitter", type=float, default=0.02, help="sigma of the log-normal factor on times")
    args = ap.parse_args(argv)
    if args.n < 1 or args.jitter < 0:
        ap.error(f"expected --n >= 1 and --jitter >= 0, got {args.n} and {args.jitter}")
    if Path(args.out, "rewards").exists():
        ap.error(f"--out {args.out}: already holds a recording; give an empty folder")
    pairs = resampled_tasks(original_tasks(), args.n, args.seed)
    print(json.dumps(write_resampled(pairs, Path(args.out), seed=args.seed, jitter=args.jitter)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
