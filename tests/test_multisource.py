"""Several recordings and task sources at once: ``tables=[...]``, ``tasks=[...]`` (train.py, evaluate.py).

The replay reads the union of the recordings, the tasks of every source are merged by id, and the run
learns and judges on exactly the tasks that have every profile group and every rule action's reward row;
the expected count is computed here straight from the recordings' Parquet parts with polars.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import load_script

REPO = Path(__file__).resolve().parents[1]
SUITE_REC = "datasets/h200_suite"
#: the main job's default recordings: the suite's and the generated tasks' on the H200, the H100's
RECORDINGS = [SUITE_REC, "datasets/recorded/h200", "datasets/recorded/h100"]
TASK_SOURCES = ("datasets/suite", "datasets/ops_gen/tasks.parquet")
MODEL = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return {body}


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
"""


def _module(name: str):
    return load_script(REPO / "workflows" / f"{name}.py", f"{name}_workflow")


def _run(*args: str, expect: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run(
        [sys.executable, str(REPO / "workflows" / "train.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == expect, f"exit {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    return proc


def _parts(recording: str, table: str) -> list[Path]:
    folder = REPO / recording / table
    return sorted(p for p in folder.rglob("*.parquet") if not p.name.startswith("."))


def _frame(recording: str, table: str, columns: list[str]) -> pl.DataFrame:
    """Every row of one table of a recording, read from its part files (each key once)."""
    parts = [pl.read_parquet(p, columns=["key", *columns]) for p in _parts(recording, table)]
    return pl.concat(parts).unique("key", keep="first", maintain_order=True)


def _expected_used(recordings: list[str], tasks: dict[str, str]) -> dict[str, int]:
    """Recording -> how many of ``tasks`` (id -> hash) it contributes with every group (the union of the
    groups any selected recorded task holds, ncu) and a seed-0 row of each rule action; a task counts
    for the first recording holding any row of it."""
    from autoprofiler.rewriters import RuleRewriter

    rule = RuleRewriter()
    profiles = pl.concat(
        [
            _frame(r, "profiles", ["task_hash", "source", "group"]).with_columns(rec=pl.lit(r))
            for r in recordings
        ]
    )
    rewards = pl.concat(
        [
            _frame(r, "rewards", ["task_hash", "kind", "rewriter", "action", "seed", "round"]).with_columns(
                rec=pl.lit(r)
            )
            for r in recordings
        ]
    )
    selected = set(tasks.values())
    held = pl.concat([profiles.select("task_hash", "rec"), rewards.select("task_hash", "rec")])
    order = {r: i for i, r in enumerate(recordings)}
    home: dict[str, str] = {}
    for task_hash, rec in held.filter(pl.col("task_hash").is_in(selected)).iter_rows():
        if task_hash not in home or order[rec] < order[home[task_hash]]:
            home[task_hash] = rec
    groups = profiles.filter(pl.col("source") == "ncu").group_by("task_hash").agg(pl.col("group").unique())
    have = {h: set(g) for h, g in groups.iter_rows() if h in home}
    required = set().union(*have.values())
    actions = (
        rewards.filter(
            (pl.col("kind") == "action")
            & (pl.col("rewriter") == rule.actions_identity)
            & (pl.col("seed") == 0)
            & (pl.col("round") == 0)
        )
        .group_by("task_hash")
        .agg(pl.col("action").unique())
    )
    acted = {h: set(a) for h, a in actions.iter_rows()}
    used = {r: 0 for r in recordings}
    for task_hash in {h for h in tasks.values() if h in home}:
        if have.get(task_hash, set()) >= required and acted.get(task_hash, set()) >= set(rule.actions()):
            used[home[task_hash]] += 1
    return used


@pytest.fixture(scope="module")
def all_tasks() -> dict[str, str]:
    from autoprofiler.tasks import load_tasks

    return {t.id: t.hash for source in TASK_SOURCES for t in load_tasks(REPO / source)}


def test_the_main_job_replays_every_recording(tmp_path, all_tasks):
    """train.py with no flags but out_dir, i.e. over the committed recordings and both task sources: it
    learns and judges on exactly the tasks with every group and every action's row (more than any one
    recording gives alone), says per recording how many it used, records every recording with its row
    counts, and judges blind, random, the four fixed configurations and the oracle with the held-out rows
    as Parquet."""
    expected = _expected_used(RECORDINGS, all_tasks)
    alone = [sum(_expected_used([r], all_tasks).values()) for r in RECORDINGS]
    total = sum(expected.values())
    assert total > max(alone), (expected, alone)

    out = tmp_path / "default"
    proc = _run(f"out_dir={out}", expect=0)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tables"] == RECORDINGS and cfg["tasks"] == list(TASK_SOURCES)
    ev = json.loads((out / "evaluation.json").read_text())
    assert ev["tasks"] + ev["train_tasks"] == total and ev["verdict"] in proc.stdout
    expected_policies = {"blind", "random", "oracle", "learned_tree", "seed_tree"}
    expected_policies |= {f"static:{n}" for n in ("algorithm", "memory", "latency", "compute")}
    assert set(ev["summary"]) == expected_policies
    rows = pl.read_parquet(out / "policy_rows.parquet")
    assert rows.height == len(expected_policies) * ev["tasks"]
    assert set(rows["policy"].unique()) == expected_policies
    recordings = {r["path"]: r for r in ev["sources"]["recordings"]}
    assert list(recordings) == RECORDINGS
    for rec in RECORDINGS:
        assert recordings[rec]["tasks_used"] == expected[rec], rec
        assert recordings[rec]["reward_rows"] == _frame(rec, "rewards", []).height
        assert recordings[rec]["profile_rows"] == _frame(rec, "profiles", []).height
        lines = [line for line in proc.stdout.splitlines() if line.startswith(f"replay: {rec}: ")]
        assert len(lines) == 1 and f": {expected[rec]} of " in lines[0], proc.stdout
    used = {s["path"]: s["tasks_used"] for s in ev["sources"]["task_sources"]}
    assert sum(used.values()) == total and all(used.values()), used
    left_out = json.loads((out / "tasks_left_out.json").read_text())
    # (a task lacking an action row only: test_environments.py::test_coverage_leaves_out_a_task_missing_...)
    assert all(why["groups"] or why["actions"] for why in left_out.values())
    report = (out / "report" / "report.md").read_text()
    first = report.splitlines()[2]
    assert all(f"`{rec}` (" in first for rec in RECORDINGS) and f"the {total} tasks" in first
    # per card: each held-out task under the card its recording measured it on, the same in every policy
    card = _task_cards(RECORDINGS)
    held_out = rows.filter(pl.col("policy") == "blind")
    assert held_out["device"].to_list() == [card[h] for h in held_out["task_hash"]]
    per_card = held_out["device"].value_counts()
    assert per_card.height == 2, per_card  # the H200's tasks and the H100's
    for policy in expected_policies:
        assert {d: s["tasks"] for d, s in ev["summary"][policy]["by_device"].items()} == dict(
            per_card.iter_rows()
        )
    assert "Per card (held-out tasks in parentheses):" in report


def _task_cards(recordings: list[str]) -> dict[str, str]:
    """Task hash -> the device named by the reward rows of the first recording holding the task."""
    cards: dict[str, str] = {}
    for rec in recordings:
        for task_hash, device in _frame(rec, "rewards", ["task_hash", "device"]).drop("key").iter_rows():
            cards.setdefault(task_hash, device)
    return cards


def _task_folder(root: Path, files: dict[str, str]) -> Path:
    folder = root / "tasks"
    folder.mkdir(parents=True)
    for name, body in files.items():
        (folder / f"{name}.py").write_text(MODEL.format(body=body))
    return folder


def test_task_sources_merge_by_id_and_conflicts_are_one_line(tmp_path):
    """The same id with the same content in two sources is one task; with other content, or one content
    under two ids, a config error of one line; so is a path that is not there."""
    from autoprofiler.workflow import ConfigError, select_tasks

    a = _task_folder(tmp_path / "a", {"relu": "torch.relu(x)", "tanh": "torch.tanh(x)"})
    same = _task_folder(tmp_path / "same", {"relu": "torch.relu(x)"})
    other = _task_folder(tmp_path / "other", {"relu": "torch.sigmoid(x)"})
    renamed = _task_folder(tmp_path / "renamed", {"relu2": "torch.relu(x)"})
    tasks, report, _ = select_tasks([str(a), str(same)])
    assert sorted(t.id for t in tasks) == ["tasks/relu", "tasks/tanh"]
    assert report.source_of["tasks/relu"] == str(a) and report.per_source(tasks) == {str(a): 2, str(same): 0}
    train = _module("train")
    for second, says in ((other, "name different content"), (renamed, "same content under two ids")):
        with pytest.raises(ConfigError) as e:
            train.read_config([f"tasks=[{a}, {second}]"])
        assert len(e.value.problems) == 1 and says in e.value.problems[0], e.value.problems
        assert "\n" not in e.value.problems[0] and "tasks/relu" in e.value.problems[0]
    with pytest.raises(ConfigError) as e:
        train.read_config(
            [f"tasks=[{a}, {tmp_path / 'nowhere'}]", f"tables=[{SUITE_REC}, {tmp_path / 'gone'}]"]
        )
    assert sorted(p.split(":")[0] for p in e.value.problems) == ["tables", "tasks"], e.value.problems
    assert all(str(tmp_path / n) in " ".join(e.value.problems) for n in ("nowhere", "gone"))
    with pytest.raises(ConfigError, match="tables: expected a path or a non-empty list of paths"):
        train.read_config(["tables=[]"])
    both = f"tables=[{RECORDINGS[0]}, {RECORDINGS[1]}]"
    cfg = _module("evaluate").read_config([both, f"tasks=[{a}, {same}]"])
    assert cfg["tables"] == RECORDINGS[:2]


def test_the_errors_come_out_before_any_work_one_line_each(tmp_path):
    """The script itself: exit 2, one line per problem, no traceback, nothing written."""
    a = _task_folder(tmp_path / "a", {"relu": "torch.relu(x)"})
    other = _task_folder(tmp_path / "other", {"relu": "torch.sigmoid(x)"})
    out = tmp_path / "never"
    proc = _run(
        f"tasks=[{a}, {other}]", f"tables=[{SUITE_REC}, {tmp_path / 'gone'}]", f"out_dir={out}", expect=2
    )
    problems = [line for line in proc.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) == 2, proc.stderr
    assert problems[0].startswith("  - tasks: 1 task id(s) name different content in two sources")
    assert problems[1] == f"  - tables: '{tmp_path / 'gone'}' does not exist"
    assert not out.exists()


def test_a_table_reads_several_folders_first_listed_wins(tmp_path):
    """``read_from``: the union of the folders' parts; a key two hold comes from the first listed, and
    each record says which folder it came from."""
    from autoprofiler.tables import CANDIDATE_SCHEMA, ParquetTable

    one, two = tmp_path / "one", tmp_path / "two"
    with ParquetTable(one, CANDIDATE_SCHEMA, flush_every=1) as t:
        t.extend(
            [{"key": "k1", "task_hash": "a", "source": "1"}, {"key": "k2", "task_hash": "b", "source": "1"}]
        )
    with ParquetTable(two, CANDIDATE_SCHEMA, flush_every=1) as t:
        t.extend(
            [{"key": "k2", "task_hash": "b", "source": "2"}, {"key": "k3", "task_hash": "c", "source": "2"}]
        )
    union = ParquetTable(None, CANDIDATE_SCHEMA, read_from=[one, two])
    assert [r["key"] for r in union.records()] == ["k1", "k2", "k3"]
    assert union.get("k2")["source"] == "1" and union.duplicates_seen == 1
    assert (union.source_of("k2"), union.source_of("k3")) == (one, two)
    assert union.rows_per_source() == {one: 2, two: 1}
    with pytest.raises(ValueError, match="dedupe"):
        union.dedupe()
