"""How far apart are two measurements of the same cell? Run-to-run noise from a recording's repeated keys.

A recording keeps one row per key; readers keep the first when a key was written twice (a resumed
call that re-measured cells an earlier call had already written). Those repeats are free repeatability
data on one card: the same task, group or action, the same code, measured again minutes later in a
fresh process. This prints, for the reward rows, how often correctness agrees and how far the two
speedups (and the reference and candidate times) are apart; and for the profile rows, per ncu group,
how far the task-level metrics are apart (the kernel duration separately) and whether the kernel
count agrees; and how much of the per-task oracle's lead over blind survives choosing on one call and
scoring on the other. The spread says which speedup differences between policies are inside timing noise.

    python bench/repeat_measurements.py datasets/recorded/h100 --out bench/results/repeat_measurements_h100
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import polars as pl

DURATION = "gpu__time_duration.sum"


def read_table(folder: Path) -> pl.DataFrame:
    """Every row of the table in ``folder`` (``run=<id>/part-*.parquet``), repeated keys included."""
    return pl.read_parquet(str(folder / "**" / "*.parquet"), hive_partitioning=True)


def repeated(frame: pl.DataFrame) -> pl.DataFrame:
    """The rows of ``frame`` whose key occurs more than once, oldest first within a key."""
    return frame.filter(pl.col("key").is_duplicated()).sort("key", "created_at", "run")


def pairs(frame: pl.DataFrame) -> list[tuple[dict, dict]]:
    """The first two rows of each repeated key."""
    out = []
    for _, group in frame.group_by("key", maintain_order=True):
        rows = group.head(2).to_dicts()
        out.append((rows[0], rows[1]))
    return out


def quantiles(values: list[float]) -> dict[str, float]:
    """Median, 90th percentile and maximum (nan when empty)."""
    if not values:
        return {"median": math.nan, "p90": math.nan, "max": math.nan}
    s = pl.Series(values, dtype=pl.Float64)
    return {"median": s.median(), "p90": s.quantile(0.9, "nearest"), "max": s.max()}


def rel(a: float | None, b: float | None) -> float | None:
    """|a - b| / max(|a|, |b|); 0 when both are 0; None when either is missing."""
    if a is None or b is None:
        return None
    top = max(abs(a), abs(b))
    return 0.0 if top == 0 else abs(a - b) / top


def reward_summary(rows: list[tuple[dict, dict]]) -> dict:
    """Correctness agreement and speedup spread of repeated reward rows, by kind and by rule action."""
    out = {}
    labels = sorted({a["kind"] for a, _ in rows}) + sorted(
        f"action {a['action']}" for a in {a["action"]: a for a, _ in rows if a["kind"] == "action"}.values()
    )
    for label in labels:
        kind, _, action = label.partition(" ")
        mine = [(a, b) for a, b in rows if a["kind"] == kind and action in ("", a["action"])]
        both = [(a, b) for a, b in mine if a["correct"] and b["correct"] and a["speedup"] and b["speedup"]]
        logs = [abs(math.log(a["speedup"] / b["speedup"])) for a, b in both]
        out[label] = {
            "pairs": len(mine),
            "correct_agree": sum(bool(a["correct"]) == bool(b["correct"]) for a, b in mine),
            "both_correct": len(both),
            "speedup_abs_log_ratio": quantiles(logs),
            "within_2pct": sum(x <= math.log(1.02) for x in logs),
            "within_5pct": sum(x <= math.log(1.05) for x in logs),
            "side_of_1_flips": sum((a["speedup"] > 1) != (b["speedup"] > 1) for a, b in both),
            "flips_beyond_5pct": sum(
                max(a["speedup"], b["speedup"]) > 1.05 and min(a["speedup"], b["speedup"]) < 1 / 1.05
                for a, b in both
            ),
            "ref_ms_rel": quantiles([x for a, b in mine if (x := rel(a["ref_ms"], b["ref_ms"])) is not None]),
            "new_ms_rel": quantiles([x for a, b in both if (x := rel(a["new_ms"], b["new_ms"])) is not None]),
        }
    return out


def profile_summary(rows: list[tuple[dict, dict]]) -> dict:
    """Per group: spread of task-level metrics between the two rows, duration separately."""
    out = {}
    for group in sorted({a["group"] for a, _ in rows}):
        metric_rel, duration_rel, same_count = [], [], 0
        mine = [(a, b) for a, b in rows if a["group"] == group]
        for a, b in mine:
            ma = json.loads(a["profile_json"])["metrics"]
            mb = json.loads(b["profile_json"])["metrics"]
            same_count += ma.get("derived__kernel_count") == mb.get("derived__kernel_count")
            for name in sorted(set(ma) & set(mb)):
                if name == "derived__kernel_count":
                    continue
                x = rel(ma[name], mb[name])
                if x is not None:
                    (duration_rel if name == DURATION else metric_rel).append(x)
        out[group] = {
            "pairs": len(mine),
            "kernel_count_agree": same_count,
            "metric_values": len(metric_rel),
            "metric_rel": quantiles(metric_rel),
            "duration_rel": quantiles(duration_rel),
        }
    return out


def identity_summary(frame: pl.DataFrame) -> dict:
    """Speedup of the ``keep`` action (the task's own code) on every task: its true speedup is 1.0."""
    frame = frame.filter((pl.col("kind") == "action") & (pl.col("action") == "keep") & pl.col("correct"))
    frame = frame.unique("key", keep="first")
    logs = [abs(math.log(x)) for x in frame["speedup"].drop_nulls().to_list() if x > 0]
    return {
        "rows": len(logs),
        "abs_log_speedup": quantiles(logs),
        "beyond_5pct": sum(x > math.log(1.05) for x in logs),
        "beyond_10pct": sum(x > math.log(1.10) for x in logs),
    }


def winners_curse(rows: list[tuple[dict, dict]], blind: str = "torch_compile") -> dict:
    """The per-task oracle over the rule actions, chosen and scored on one call, against chosen on one
    call and scored on the other (both ways round), each relative to ``blind``'s action scored on the
    same call as the oracle. The gap between the two ratios is the oracle's winner's curse: part of a
    max over noisy measurements is the noise. Tasks count when both calls measured every action the
    task has rows for, ``blind``'s among them; outcomes are effective speedups (a wrong candidate 1.0x)."""
    calls: dict[str, tuple[dict, dict]] = {}
    for a, b in rows:
        if a["kind"] != "action":
            continue
        first, second = calls.setdefault(a["task_id"], ({}, {}))
        first[a["action"]], second[a["action"]] = a["effective_speedup"], b["effective_speedup"]
    tasks = [
        (first, second)
        for first, second in calls.values()
        if blind in first and len(first) > 1 and all(v for v in [*first.values(), *second.values()])
    ]
    if not tasks:
        return {"tasks": 0}
    in_sample, cross, changed = [], [], 0
    for first, second in tasks:
        for pick, score in ((first, second), (second, first)):
            best = max(pick, key=pick.get)
            in_sample.append(math.log(pick[best] / pick[blind]))
            cross.append(math.log(score[best] / score[blind]))
        changed += max(first, key=first.get) != max(second, key=second.get)
    n = len(in_sample)
    return {
        "tasks": len(tasks),
        "blind": blind,
        "oracle_in_sample_over_blind": math.exp(sum(in_sample) / n),
        "oracle_cross_call_over_blind": math.exp(sum(cross) / n),
        "best_action_differs": changed,
    }


def markdown(
    recording: Path,
    rewards: dict,
    profiles: dict,
    identity: dict,
    curse: dict,
    tasks: int,
    runs: list[str],
) -> str:
    """The three tables as Markdown."""
    pct = lambda x: "-" if math.isnan(x) else f"{100 * x:.1f}%"  # noqa: E731
    ratio = lambda x: "-" if math.isnan(x) else f"{math.exp(x):.3f}x"  # noqa: E731
    lines = [
        f"# Repeated measurements in `{recording}`",
        "",
        f"{tasks} tasks measured twice (runs {', '.join(runs) or 'none'}). Produced by",
        f"`python bench/repeat_measurements.py {recording}`.",
        "",
        "## Reward rows",
        "",
        "| kind | pairs | correct agrees | both correct | speedup ratio median | p90 | max |"
        " within 2% | within 5% | flips across 1.0 | flips beyond ±5% |"
        " ref_ms rel. median | p90 | new_ms rel. median | p90 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, s in rewards.items():
        q, r, n = s["speedup_abs_log_ratio"], s["ref_ms_rel"], s["new_ms_rel"]
        lines.append(
            f"| {kind} | {s['pairs']} | {s['correct_agree']} | {s['both_correct']} | {ratio(q['median'])} | "
            f"{ratio(q['p90'])} | {ratio(q['max'])} | {s['within_2pct']} | {s['within_5pct']} | "
            f"{s['side_of_1_flips']} | {s['flips_beyond_5pct']} | {pct(r['median'])} | {pct(r['p90'])} | "
            f"{pct(n['median'])} | {pct(n['p90'])} |"
        )
    lines += [
        "",
        "The speedup ratio is max/min of the two speedups of one cell. A flip across 1.0: one run says"
        " faster, the other slower; beyond ±5%: one says more than 1.05x, the other less than 1/1.05x.",
        "",
        "## The per-task oracle's winner's curse",
        "",
    ]
    if curse["tasks"]:
        lines += [
            f"| tasks | oracle / {curse['blind']}, chosen and scored on one call |"
            " chosen on one call, scored on the other | best action differs between calls |",
            "|---:|---:|---:|---:|",
            f"| {curse['tasks']} | {curse['oracle_in_sample_over_blind']:.3f} | "
            f"{curse['oracle_cross_call_over_blind']:.3f} | {curse['best_action_differs']} |",
            "",
            "Geometric means over both directions (call 1 picks and call 2 scores, and the reverse); the"
            f" blind action `{curse['blind']}` is scored on the same call as the oracle it is compared"
            " with. The first ratio is what a replay of one recording reports for the oracle; the second"
            " is what choosing the best action per task is worth on a fresh measurement.",
        ]
    else:
        lines.append("No task has every action measured on both calls.")
    lines += [
        "",
        "## The identity candidate on every task (one measurement each)",
        "",
        "| correct `keep` rows | speedup off 1.0 median | p90 | max | beyond ±5% | beyond ±10% |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {identity['rows']} | {ratio(identity['abs_log_speedup']['median'])} | "
        f"{ratio(identity['abs_log_speedup']['p90'])} | {ratio(identity['abs_log_speedup']['max'])} | "
        f"{identity['beyond_5pct']} | {identity['beyond_10pct']} |",
        "",
        "`keep` evaluates the task's own code as the candidate; any distance from 1.0x is noise between the"
        " reference's and the candidate's timing within one evaluation.",
        "",
        "## Profile rows (task-level metrics, |a-b|/max(|a|,|b|))",
        "",
        "| group | pairs | kernel count agrees | metric values | median | p90 | max |"
        " duration median | duration p90 | duration max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for group, s in profiles.items():
        m, d = s["metric_rel"], s["duration_rel"]
        lines.append(
            f"| {group} | {s['pairs']} | {s['kernel_count_agree']} | {s['metric_values']} | "
            f"{pct(m['median'])} | {pct(m['p90'])} | {pct(m['max'])} | "
            f"{pct(d['median'])} | {pct(d['p90'])} | {pct(d['max'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recording", type=Path, help="a recording folder with profiles/ and rewards/")
    parser.add_argument("--out", type=Path, help="write <out>.md and <out>.json")
    args = parser.parse_args(argv)
    for name in ("profiles", "rewards"):
        if not (args.recording / name).is_dir():
            parser.error(f"{args.recording} has no {name}/ folder: not a recording")
    reward_table = read_table(args.recording / "rewards")
    reward_rows, profile_rows = repeated(reward_table), repeated(read_table(args.recording / "profiles"))
    runs = sorted(set(reward_rows["run"].to_list()) | set(profile_rows["run"].to_list()))
    tasks = len(set(reward_rows["task_id"].to_list()) | set(profile_rows["task_id"].to_list()))
    reward_pairs = pairs(reward_rows)
    rewards, profiles = reward_summary(reward_pairs), profile_summary(pairs(profile_rows))
    identity = identity_summary(reward_table)
    curse = winners_curse(reward_pairs)
    text = markdown(args.recording, rewards, profiles, identity, curse, tasks, runs)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(text)
        payload = {"recording": str(args.recording), "tasks": tasks, "runs": runs,
                   "rewards": rewards, "profiles": profiles, "identity": identity,
                   "winners_curse": curse}
        args.out.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
