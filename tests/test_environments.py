"""Environments and the reward store: keyed Parquet tables, live caching and resume, replay answers."""

from __future__ import annotations

import logging
import re
import shutil
import time
from pathlib import Path

import pytest
from conftest import REPLAY_FIXTURE, load_replay_fixture

from autoprofiler import rewards
from autoprofiler.cells import Cell, CellFailure, WorkItem
from autoprofiler.environments import (
    LiveEnvironment,
    MissingOutcome,
    MissingProfile,
    RecordedProfiler,
    ReplayEnvironment,
    derive_configuration_rows,
    record,
)
from autoprofiler.environments.recording import memory_line
from autoprofiler.evaluation import EvalResult, EvaluatorError
from autoprofiler.profiling.cache import CacheEnvironment
from autoprofiler.profiling.groups import CONFIGURATIONS, GROUPS
from autoprofiler.profiling.profile import Profile
from autoprofiler.rewriters.rule import RuleRewriter
from autoprofiler.runtime import LocalDriver
from autoprofiler.tables import ProfileTable, RewardTable
from autoprofiler.tasks import Task, check_source, refinement_task

FIXTURE = REPLAY_FIXTURE

fx = load_replay_fixture()
TASKS = fx.fixture_tasks()
ELEMENTWISE, MATMUL = TASKS[0], TASKS[-1]
N = len(TASKS)


@pytest.fixture(scope="module")
def replay():
    return ReplayEnvironment.from_dir(FIXTURE, rewriter=RuleRewriter(), source="torch")


# --- test doubles for the live path: a profiler answering the fixture's metrics, a scripted evaluator ---
class FixtureProfiler:
    """Answers ``collect`` with the fixture's metrics; counts collections per (task, group)."""

    source = "torch"
    environment = CacheEnvironment("cpu", "", "fixture")

    def __init__(self):
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.index = {t.hash: i for i, t in enumerate(TASKS)}

    def collect_many(self, tasks, groups):
        return [self.collect(t, groups) for t in tasks]

    def remember(self, profile):
        pass

    def forget(self, task_hash=None):
        pass

    def collect(self, task, groups):
        groups = tuple(sorted(groups))
        self.calls.append((task.hash, groups))
        metrics = fx.task_metrics(self.index[task.hash])
        names = {m for g in groups for m in GROUPS[g].metrics}
        return Profile(
            task.hash,
            "torch",
            frozenset(groups),
            {m: metrics[m] for m in names},
            [],
            0,
            0.1 * len(groups),
            "cpu",
        )


class Crash(RuntimeError):
    pass


class ScriptedEvaluator:
    """Returns the fixture's speedup for the action named in the candidate's header; can crash after N."""

    def __init__(self, crash_after: int | None = None):
        self.calls = 0
        self.crash_after = crash_after
        self.index = {t.hash: i for i, t in enumerate(TASKS)}

    def close(self):
        pass

    def evaluate(self, task, source):
        if self.crash_after is not None and self.calls >= self.crash_after:
            raise Crash(f"simulated crash after {self.calls} evaluations")
        self.calls += 1
        action = re.search(r"action '(\w+)'", source).group(1)
        correct, s = fx.action_speedup(self.index[task.hash], action)
        return EvalResult(
            True, correct, None if correct else "wrong_output", "", 1.0, 1.0 / s, 0.01, 0.01, s, "cpu", 0.2
        )


# --- reward table ------------------------------------------------------------------------------------
def test_reward_table_appends_in_batches_and_keeps_each_key_once(tmp_path):
    """Rows are visible at once, written every flush_every rows, deduplicated by key across parts."""
    table = RewardTable(tmp_path, flush_every=2)
    keys = [rewards.outcome_key("h", f"c{i}", "r", 0, 0) for i in range(3)]
    for k in keys:
        assert table.append({"key": k, "task_hash": "h", "speedup": 1.0})
    assert not table.append({"key": keys[0], "task_hash": "h", "speedup": 9.0})  # already there
    assert len(list(tmp_path.glob("part-*.parquet"))) == 1  # 2 flushed, 1 pending
    table.flush()
    assert len(RewardTable(tmp_path)) == 3
    # a second writer appending the same key (a crashed run resumed elsewhere) is deduplicated on read
    other = RewardTable(tmp_path / "other", flush_every=1)
    other.append({"key": keys[0], "task_hash": "h", "speedup": 9.0})
    shutil.copy(next((tmp_path / "other").glob("part-*.parquet")), tmp_path / "part-zzzz-dup.parquet")
    again = RewardTable(tmp_path)
    assert len(again) == 3 and again.duplicates_seen == 1 and again.get(keys[0]).speedup == 1.0
    again.dedupe()
    assert len(list(tmp_path.glob("part-*.parquet"))) == 1 and len(RewardTable(tmp_path)) == 3


def test_reward_table_rejects_unknown_columns(tmp_path):
    """A row with a column outside REWARD_SCHEMA is an error naming the column."""
    with pytest.raises(ValueError, match="not_a_column"):
        RewardTable(tmp_path).append({"key": "k", "not_a_column": 1})


# --- replay ------------------------------------------------------------------------------------------
def test_replay_rule_rewriter_answers_every_configuration(replay):
    """The rule decision is re-run on recorded metrics restricted to the configuration."""
    root_memory = replay.outcome(ELEMENTWISE, "torch_memory+torch_root")
    assert root_memory.action == "torch_compile" and root_memory.speedup == pytest.approx(1.30)
    assert replay.outcome(MATMUL, "torch_memory+torch_root").action == "keep"
    # showing torch_launch makes every task look launch-bound -> cuda_graph
    for t in (ELEMENTWISE, MATMUL):
        assert replay.outcome(t, "torch_launch+torch_root").action == "cuda_graph"
    # a configuration never recorded as such is still answerable; blind takes the default action
    row = replay.outcome(MATMUL, "torch_flops+torch_ops")
    assert row.configuration == "torch_flops+torch_ops" and row.reward == 0.0
    assert replay.outcome(MATMUL, "").action == "torch_compile"
    rid = RuleRewriter().identity
    assert row.key == rewards.outcome_key(MATMUL.hash, "torch_flops+torch_ops", rid, 0, 0)


def test_replay_costs_come_from_the_recording(replay):
    """profile_seconds of a row is the recorded cost of its configuration's groups."""
    row = replay.outcome(ELEMENTWISE, "torch_memory+torch_root")
    expected = sum(0.05 * (1 + len(GROUPS[g].metrics)) for g in ("torch_root", "torch_memory"))
    assert row.profile_seconds == pytest.approx(expected)


class NamedRewriter:
    def __init__(self, identity):
        self.identity = identity


def test_replay_llm_rewriter_answers_only_recorded_cells(replay):
    """A non-rule rewriter gets recorded cells; anything else is MissingOutcome naming the cell."""
    llm = NamedRewriter("fixture-llm")
    assert replay.outcome(ELEMENTWISE, "torch_memory+torch_root", llm).llm_calls == 1
    with pytest.raises(MissingOutcome, match=r"fixture/fx_19.*'torch_memory\+torch_root'.*fixture-llm"):
        replay.outcome(MATMUL, "torch_memory+torch_root", llm)


def test_replay_rounds_beyond_the_recording_are_a_clear_error(replay):
    """Round 1 was never recorded: the error names the action, rewriter, seed and round."""
    with pytest.raises(MissingOutcome, match="round 1"):
        replay.outcome(ELEMENTWISE, "torch_memory+torch_root", round=1)


def test_recorded_profiler_missing_group_names_task_and_group(replay):
    """A group not recorded for a task is a MissingProfile naming both."""
    with pytest.raises(MissingProfile, match=r"fixture/fx_00.*\['speed_of_light'\]"):
        replay.profile(ELEMENTWISE, ["torch_root", "speed_of_light"])


def test_recorded_profiler_is_cumulative_like_the_profiler():
    """collect() returns every group so far; cost counts only groups new to the call; reset forgets."""
    rp = RecordedProfiler(ProfileTable(FIXTURE / "profiles"), "torch")
    first = rp.collect(ELEMENTWISE, ["torch_root"])
    second = rp.collect(ELEMENTWISE, ["torch_root", "torch_launch"])
    assert first.groups == {"torch_root"} and second.groups == {"torch_root", "torch_launch"}
    assert second.seconds == pytest.approx(0.05 * (1 + len(GROUPS["torch_launch"].metrics)))
    assert "torch__launch_overhead_share" in second.metrics and "torch__io_bytes" not in second.metrics
    assert rp.collect(ELEMENTWISE, ["torch_root"]).seconds == 0.0
    rp.reset()
    assert rp.collect(ELEMENTWISE, ["torch_root"]).seconds > 0


# --- live --------------------------------------------------------------------------------------------
CONFIGS = [
    "torch_memory+torch_root",
    "torch_launch+torch_root",
    "torch_flops+torch_root",
    "torch_ops+torch_root",
]


def _run(env, tasks):
    for t in tasks:  # the live loop: map over (task, configuration)
        for c in CONFIGS:
            env.outcome(t, c)


def test_live_caches_by_action_and_never_computes_twice(tmp_path):
    """Configurations leading to the same action share one evaluation; a second pass computes nothing."""
    ev, prof = ScriptedEvaluator(), FixtureProfiler()
    env = LiveEnvironment(prof, RuleRewriter(), ev, tmp_path)
    _run(env, TASKS[:4])
    # elementwise tasks: memory/flops/ops -> torch_compile, launch -> cuda_graph: 2 evaluations per task
    assert ev.calls == 8 and env.stats.action_reuse == 8
    assert {g for _, gs in prof.calls for g in gs} == {
        "torch_root",
        "torch_memory",
        "torch_launch",
        "torch_flops",
        "torch_ops",
    }
    collected = [(h, g) for h, gs in prof.calls for g in gs]
    assert len(collected) == len(set(collected)) == 4 * 5  # each (task, group) collected exactly once
    env.close()
    again = LiveEnvironment(FixtureProfiler(), RuleRewriter(), ScriptedEvaluator(crash_after=0), tmp_path)
    _run(again, TASKS[:4])  # would raise Crash if anything were evaluated
    assert again.stats.from_table == 16
    rows = again.rows()
    assert len(rows) == len({r.key for r in rows}) == 16 + 8  # configuration rows + action rows
    assert sum(r.kind == "action" for r in rows) == 8


def test_live_crash_then_resume_produces_each_key_exactly_once(tmp_path):
    """Killed after N evaluations (an exception), resumed: every key once, no evaluation repeated."""
    env = LiveEnvironment(
        FixtureProfiler(), RuleRewriter(), ScriptedEvaluator(crash_after=5), tmp_path, flush_every=2
    )
    with pytest.raises(Crash):
        _run(env, TASKS)
    # what the crashed process wrote: only flushed parts survive (no close)
    survived = RewardTable(tmp_path / "rewards")
    assert 0 < len(survived) < N * len(CONFIGS) + 2 * N
    ev = ScriptedEvaluator()
    resumed = LiveEnvironment(FixtureProfiler(), RuleRewriter(), ev, tmp_path)
    _run(resumed, TASKS)
    resumed.close()
    done_actions = {r.key for r in survived.rows() if r.kind == "action"}
    assert ev.calls == 2 * N - len(done_actions)  # N tasks x 2 distinct actions, minus those saved before
    final = RewardTable(tmp_path / "rewards")
    assert final.duplicates_seen == 0
    keys = [r.key for r in final.rows()]
    assert len(keys) == len(set(keys)) == N * len(CONFIGS) + 2 * N
    expected = {rewards.outcome_key(t.hash, c, RuleRewriter().identity, 0, 0) for t in TASKS for c in CONFIGS}
    assert expected <= set(keys)


def test_record_then_replay_answers_the_same(tmp_path):
    """record() profiles every group and evaluates every action; a replay then answers as the live env did."""
    env = LiveEnvironment(FixtureProfiler(), RuleRewriter(), ScriptedEvaluator(), tmp_path)
    groups = list(fx.RECORDED_GROUPS)
    summary = record(TASKS[:3], env, groups, configurations={"memory": ("torch_root", "torch_memory")})
    assert summary["failures"] == [] and summary["evaluations"] == 3 * len(RuleRewriter.actions())
    assert summary["profile_rows"] == 3 * len(groups)
    live_row = env.outcome(TASKS[1], "torch_launch+torch_root")
    rep = ReplayEnvironment.from_dir(tmp_path, rewriter=RuleRewriter(), source="torch")
    rep_row = rep.outcome(TASKS[1], "torch_launch+torch_root")
    for k in ("key", "action", "speedup", "reward", "profile_seconds", "candidate_hash"):
        assert getattr(rep_row, k) == getattr(live_row, k), k
    assert rep.candidate_source(rep_row.candidate_hash).count("class ModelNew") == 1


def test_refinement_task_is_a_loadable_task():
    """The best candidate so far becomes a KernelBench task whose Model is the candidate's ModelNew."""
    rule = RuleRewriter()
    cand = rule.source_for(ELEMENTWISE, "torch_compile")
    nxt = refinement_task(ELEMENTWISE, cand, 1)
    check_source(nxt.source)
    assert nxt.id.endswith("@r1") and "class Model(nn.Module)" in nxt.source and "ModelNew" not in nxt.source
    bare = (
        "import torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"
    )
    check_source(refinement_task(ELEMENTWISE, bare, 2).source)


class BatchProfiler(FixtureProfiler):
    """A FixtureProfiler with a batch mode whose joint cost is 1 s per task."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def collect_many(self, tasks, groups):
        self.batches.append(([t.hash for t in tasks], tuple(sorted(groups))))
        return [
            Profile(p.task_hash, "torch", p.groups, p.metrics, [], 0, 1.0, "cpu")
            for p in (FixtureProfiler.collect(self, t, groups) for t in tasks)
        ]


def test_prefetch_batches_and_apportions_the_cost(tmp_path):
    """prefetch profiles all tasks in one batch; each group gets an equal share of a task's joint cost."""
    prof = BatchProfiler()
    env = LiveEnvironment(prof, RuleRewriter(), ScriptedEvaluator(), tmp_path)
    groups = list(fx.RECORDED_GROUPS)
    assert env.prefetch(TASKS[:5], groups) == []
    assert len(prof.batches) == 1 and prof.calls == [(t.hash, tuple(sorted(groups))) for t in TASKS[:5]]
    assert env.group_cost(TASKS[0], groups)[1] == pytest.approx(1.0)
    assert env.group_cost(TASKS[0], ["torch_root"])[1] == pytest.approx(1.0 / len(groups))
    assert env.prefetch(TASKS[:5], groups) == [] and len(prof.batches) == 1  # nothing left to collect
    env.outcome(TASKS[0], "torch_launch+torch_root")
    assert len(prof.calls) == 5  # the outcome's profile came from the table


@pytest.mark.gpu
def test_live_ncu_record_then_replay_on_the_gpu(tmp_path):
    """H200: record one suite task with ncu (root + the memory configuration's groups, every rule action),
    then replay it: the replayed memory-configuration row equals the live one."""
    from autoprofiler.evaluation import EvalConfig, Evaluator
    from autoprofiler.profiling import CONFIGURATIONS, Profiler
    from autoprofiler.tasks import load_task_file

    task = load_task_file(
        Path(__file__).resolve().parents[1] / "datasets" / "suite" / "l2" / "linear_gelu.py"
    )
    groups = ["root", *CONFIGURATIONS["memory"]]
    evaluator = Evaluator(EvalConfig(device="cuda", timing_trials=30, warmup=5, correctness_trials=3))
    try:
        env = LiveEnvironment(Profiler(source="ncu", device="cuda"), RuleRewriter(), evaluator, tmp_path)
        summary = record([task], env, groups, configurations={"memory": CONFIGURATIONS["memory"]})
    finally:
        evaluator.close()
    assert summary["failures"] == [] and summary["complete"], summary
    assert summary["evaluations"] == len(RuleRewriter.actions())
    profiles = ProfileTable(tmp_path / "profiles").rows()
    assert {p["group"] for p in profiles} == set(groups) and all(p["passes"] > 0 for p in profiles)
    config = rewards.configuration_name(CONFIGURATIONS["memory"])
    live_key = rewards.outcome_key(task.hash, config, RuleRewriter().identity, 0, 0)
    live_row = RewardTable(tmp_path / "rewards").get(live_key)
    rep = ReplayEnvironment.from_dir(tmp_path, rewriter=RuleRewriter(), source="ncu")
    row = rep.outcome(task, config)
    assert row.action == live_row.action and row.speedup == live_row.speedup
    assert row.device and row.device != "cpu"


def test_joint_record_resumes_asking_only_for_missing_groups(tmp_path):
    """record(joint=True) after a partial recording batches each distinct missing set once."""
    groups = list(fx.RECORDED_GROUPS)
    first = LiveEnvironment(BatchProfiler(), RuleRewriter(), ScriptedEvaluator(), tmp_path)
    first.prefetch(TASKS[:2], groups[:2])  # a recording stopped after two groups for two tasks
    first.close()
    prof = BatchProfiler()
    env = LiveEnvironment(prof, RuleRewriter(), ScriptedEvaluator(), tmp_path)
    summary = record(TASKS[:4], env, groups, joint=True)
    assert summary["complete"] and summary["failures"] == []
    assert sorted((sorted(h), g) for h, g in prof.batches) == sorted(
        [
            (sorted(t.hash for t in TASKS[:2]), tuple(sorted(groups[2:]))),
            (sorted(t.hash for t in TASKS[2:4]), tuple(sorted(groups))),
        ]
    )
    assert summary["profile_rows"] == 4 * len(groups)
    assert summary["evaluations"] == 4 * len(RuleRewriter.actions())
    keys = [r.key for r in RewardTable(tmp_path / "rewards").rows()]
    assert len(keys) == len(set(keys)) == 4 * len(RuleRewriter.actions())


def test_joint_record_goes_batch_by_batch_and_stops_between_batches(tmp_path):
    """joint_batch=2 over 5 tasks: three profiled processes, each written before the next; a budget
    already spent stops before the first batch and the summary says incomplete."""
    groups = list(fx.RECORDED_GROUPS)
    stopped = LiveEnvironment(BatchProfiler(), RuleRewriter(), ScriptedEvaluator(), tmp_path / "a")
    summary = record(TASKS[:5], stopped, groups, joint=True, joint_batch=2, max_seconds=-1)
    assert not summary["complete"] and summary["profile_rows"] == 0 and summary["evaluations"] == 0
    prof = BatchProfiler()
    env = LiveEnvironment(prof, RuleRewriter(), ScriptedEvaluator(), tmp_path / "b")
    summary = record(TASKS[:5], env, groups, joint=True, joint_batch=2)
    assert [len(hashes) for hashes, _ in prof.batches] == [2, 2, 1]
    assert summary["complete"] and summary["profile_rows"] == 5 * len(groups)


def test_record_in_chunks_finishes_each_chunk_before_the_next(tmp_path):
    """chunk=2 over 5 tasks, one group per profiled process: each chunk's groups, then its actions,
    before the next chunk's profiles; a budget already spent starts nothing."""
    groups = list(fx.RECORDED_GROUPS)
    prof = BatchProfiler()
    env = LiveEnvironment(prof, RuleRewriter(), ScriptedEvaluator(), tmp_path / "a")
    summary = record(TASKS[:5], env, groups, chunk=2)
    assert [len(hashes) for hashes, _ in prof.batches] == [2] * len(groups) + [2] * len(groups) + [1] * len(
        groups
    )
    assert all(len(g) == 1 for _, g in prof.batches)  # each group its own process
    assert summary["complete"] and summary["profile_rows"] == 5 * len(groups)
    assert summary["evaluations"] == 5 * len(RuleRewriter.actions())
    spent = LiveEnvironment(BatchProfiler(), RuleRewriter(), ScriptedEvaluator(), tmp_path / "b")
    summary = record(TASKS[:5], spent, groups, chunk=2, max_seconds=0.0)
    assert not summary["complete"] and summary["profile_rows"] == 0 and summary["evaluations"] == 0


class CrowdedEvaluator(ScriptedEvaluator):
    """A ScriptedEvaluator that fails some (task, action) evaluations with ``EvaluatorError`` (the
    evaluator's fault, as a candidate crowded out of GPU memory) the first ``times[(task, action)]``
    times they are asked for."""

    def __init__(self, times: dict[tuple[str, str], int], causes: dict[str, str] | None = None):
        super().__init__()
        self.times = dict(times)
        self.causes = dict(causes or {})  # action -> EvaluatorError.cause ("": none named)
        self.asked: list[tuple[str, str]] = []

    def evaluate(self, task, source):
        action = re.search(r"action '(\w+)'", source).group(1)
        self.asked.append((task.hash, action))
        if self.times.get((task.hash, action), 0) > 0:
            self.times[(task.hash, action)] -= 1
            cause = self.causes.get(action, "")
            raise EvaluatorError(f"{action}: out of memory at a share other evaluations shrank", cause=cause)
        return super().evaluate(task, source)


def test_record_evaluates_again_what_the_evaluator_failed(tmp_path, caplog):
    """An evaluation the evaluator failed is evaluated again in the same run: together with the other
    such cells, then alone, and the log tallies why and gives each failure whole; a cell failing every time
    stays a failure (no row), and the next run asks for it again."""
    groups = list(fx.RECORDED_GROUPS)
    a, b = TASKS[0].hash, TASKS[1].hash
    causes = {"keep": "candidate_crowded_out", "tf32": "no_room"}  # cuda_graph's names none
    ev = CrowdedEvaluator({(a, "tf32"): 1, (b, "keep"): 2, (b, "cuda_graph"): 3}, causes)
    env = LiveEnvironment(BatchProfiler(), RuleRewriter(), ev, tmp_path)
    with caplog.at_level(logging.INFO, logger="autoprofiler.environments.recording"):
        summary = record(TASKS[:2], env, groups, chunk=2)
    assert "evaluating 3 cells again together (the evaluator failed them: " in caplog.text
    tally = "cuda_graph 1, keep 1, tf32 1; candidate out of memory 1, no room 1, other 1)"
    assert "failed them: " + tally in caplog.text
    tally = "cuda_graph 1, keep 1; candidate out of memory 1, other 1)"
    assert "failed them: " + tally in caplog.text  # the pass alone
    assert "evaluating 2 cells again one at a time" in caplog.text
    assert "out of memory at a share other evaluations shrank" in caplog.text
    assert caplog.text.count("  the evaluator failed: ") == 3 + 2  # each failed cell, each pass
    assert f"the evaluator failed: {TASKS[1].id} [{b}] action 'cuda_graph'" in caplog.text
    assert ev.asked.count((a, "tf32")) == 2  # failed, then right in the pass of them together
    assert ev.asked.count((b, "keep")) == 3  # failed, failed together, right alone
    assert ev.asked.count((b, "cuda_graph")) == 3  # failed every time: once, together, alone
    assert [(f["task_id"], f["stage"]) for f in summary["failures"]] == [(TASKS[1].id, "action:cuda_graph")]
    assert not summary["complete"]
    rows = {(r.task_hash, r.action) for r in RewardTable(tmp_path / "rewards").rows() if r.kind == "action"}
    assert rows == {(t.hash, x) for t in TASKS[:2] for x in RuleRewriter.actions()} - {(b, "cuda_graph")}
    env.close()
    again = CrowdedEvaluator({})
    resumed = LiveEnvironment(BatchProfiler(), RuleRewriter(), again, tmp_path)
    assert record(TASKS[:2], resumed, groups, chunk=2)["complete"]
    assert again.asked == [(b, "cuda_graph")]


class MeteredEvaluator(ScriptedEvaluator):
    """A ScriptedEvaluator whose ``cuda_graph`` results carry a CUDA memory plan with the candidate's
    peak, as the evaluator's ``details["memory_plan"]`` does on a GPU."""

    PLAN = {
        "candidate_bytes": 2 * 2**30,
        "headroom_bytes": 2**29,
        "candidate_cap_bytes": 5 * 2**29,
        "beside_others": True,
        "candidate_peak_reserved_bytes": 3 * 2**30,
    }

    def evaluate(self, task, source):
        result = super().evaluate(task, source)
        if "action 'cuda_graph'" in source:
            result.details["memory_plan"] = dict(self.PLAN)
        return result


def test_record_logs_what_each_candidate_reserved_against_its_plan(tmp_path, caplog):
    """A result whose memory plan has the candidate's device peak gets one log line (what the headroom
    is to be sized from); a plan without it (CPU) none; the reward table gets no memory column."""
    env = LiveEnvironment(BatchProfiler(), RuleRewriter(), MeteredEvaluator(), tmp_path)
    with caplog.at_level(logging.INFO, logger="autoprofiler.environments.recording"):
        assert record(TASKS[:2], env, list(fx.RECORDED_GROUPS), chunk=2)["complete"]
    lines = [ln for ln in caplog.text.splitlines() if "memory: " in ln]
    assert len(lines) == 2, lines
    assert lines[0].endswith(
        f"memory: {TASKS[0].id} action 'cuda_graph': the candidate reserved 3 GiB at most; planned 2 GiB, "
        "headroom 0.5 GiB, cap 2.5 GiB, beside others"
    )
    assert memory_line(Cell(TASKS[0], rewriter="r", action="keep"), {"candidate_bytes": 1}) is None
    alone = {**MeteredEvaluator.PLAN, "beside_others": False, "candidate_cap_bytes": None}
    assert memory_line(Cell(TASKS[0], rewriter="r", action="keep"), alone).endswith("cap none, alone")
    rows = [r for r in RewardTable(tmp_path / "rewards").rows() if r.action == "cuda_graph"]
    assert len(rows) == 2 and all(r.memory is None for r in rows)  # travels with the row, not stored
    assert "memory" not in rows[0].to_record()


class SlowBatchProfiler(BatchProfiler):
    """A BatchProfiler whose every profiled batch takes ``seconds`` of wall time."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def collect_many(self, tasks, groups):
        time.sleep(self.seconds)
        return super().collect_many(tasks, groups)


def test_record_starts_no_batch_that_would_end_past_the_budget(tmp_path, caplog):
    """A batch of about 1 s in a 1.6 s budget: the second would end past it, so it does not start (a
    device call's hard limit would kill it half-way), and the chunk's actions wait with it. The log
    does not call a chunk recorded that was not, and no later chunk is started."""
    groups = list(fx.RECORDED_GROUPS)
    prof = SlowBatchProfiler(1.0)
    env = LiveEnvironment(prof, RuleRewriter(), ScriptedEvaluator(), tmp_path)
    with caplog.at_level(logging.INFO, logger="autoprofiler.environments.recording"):
        summary = record(TASKS[:4], env, groups, chunk=2, max_seconds=1.6)
    assert len(prof.batches) == 1 and not summary["complete"]
    assert summary["profile_rows"] == 2 and summary["evaluations"] == 0
    assert "tasks 1-2 of 4: not all recorded (10 action cells not started)" in caplog.text, caplog.text
    assert "recorded tasks" not in caplog.text and "3-4" not in caplog.text


class SleepyWorker:
    """A worker whose every batch of cells takes ``seconds``; it notes when each batch ended."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.ended: list[float] = []

    def run_cells(self, batch):
        time.sleep(self.seconds)
        self.ended.append(time.monotonic())
        return [item.cell.key for item in batch]


def test_the_driver_starts_no_batch_that_would_end_past_the_deadline():
    """Batches of 0.5 s before a deadline 1.25 s away: the third would start before the deadline but
    end past it (where a device call's hard limit kills it and its work is lost), so it does not start;
    a batch starts only if the longest so far would still end in time."""
    worker = SleepyWorker(0.5)
    cells = [Cell(TASKS[0], (), RuleRewriter().actions_identity, 0, 0, a, policy="action") for a in "abcde"]
    deadline = time.monotonic() + 1.25
    results = LocalDriver(worker).run_cells([WorkItem(c) for c in cells], deadline)
    assert worker.ended and max(worker.ended) <= deadline + 0.1
    skipped = [r for r in results if isinstance(r, CellFailure)]
    assert skipped and all(r.kind == "not_started" for r in skipped)
    assert results[: len(worker.ended)] == [c.key for c in cells[: len(worker.ended)]]


class SlowEvaluator(ScriptedEvaluator):
    """A ScriptedEvaluator whose every evaluation takes ``seconds``; it notes when each one ended."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds
        self.ended: list[float] = []

    def evaluate(self, task, source):
        time.sleep(self.seconds)
        result = super().evaluate(task, source)
        self.ended.append(time.monotonic())
        return result


def test_record_starts_no_evaluation_that_would_end_past_the_budget(tmp_path):
    """Evaluations of 0.5 s in a 1.25 s budget: none ends past the budget (the third would start inside
    it and end past it), and what did not start is left for a resumed run (counted as ``not_started``,
    not as failures), which evaluates only that.
    The profiles are recorded first, so the budget is the evaluations' alone, however long profiling
    takes on the machine."""
    groups = list(fx.RECORDED_GROUPS)
    ev = SlowEvaluator(0.5)
    env = LiveEnvironment(BatchProfiler(), RuleRewriter(), ev, tmp_path)
    assert env.prefetch(TASKS[:2], groups) == []
    t0 = time.monotonic()
    summary = record(TASKS[:2], env, groups, max_seconds=1.25)
    assert ev.ended and not summary["complete"]
    assert max(ev.ended) - t0 <= 1.25 + 0.1, [round(t - t0, 2) for t in ev.ended]
    assert summary["evaluations"] == len(ev.ended)  # the cells not started are not counted
    left = 2 * len(RuleRewriter.actions()) - len(ev.ended)
    assert summary["not_started"] == left > 0 and summary["failures"] == []  # left for --resume, not failed
    env.close()
    again = SlowEvaluator(0.0)
    resumed = LiveEnvironment(BatchProfiler(), RuleRewriter(), again, tmp_path)
    assert record(TASKS[:2], resumed, groups)["complete"]
    assert len(ev.ended) + len(again.ended) == 2 * len(RuleRewriter.actions())


def test_derive_configuration_rows_from_actions_and_profiles(tmp_path):
    """A recording with action rows only (``oracle_sweep --evaluate-only``): every configuration row the
    rule rewriter implies is written once, equal to the replayed outcome; a task missing a group is listed."""
    shutil.copytree(REPLAY_FIXTURE, tmp_path / "rec")
    rewards_dir = tmp_path / "rec" / "rewards"
    actions = [r for r in RewardTable(rewards_dir).rows() if r.kind == "action"]
    shutil.rmtree(rewards_dir)
    table = RewardTable(rewards_dir)
    table.extend(actions)
    table.flush()
    env = ReplayEnvironment.from_dir(tmp_path / "rec", rewriter=RuleRewriter(), source="torch")
    configs = {k: v for k, v in CONFIGURATIONS.items() if k.startswith("torch_")}
    stranger = Task.from_source("fixture/unrecorded", TASKS[0].source + "\n# another task\n")
    result = derive_configuration_rows(env, [*TASKS, stranger], configs, into=RewardTable(rewards_dir))
    assert result["written"] == len(TASKS) * len(configs)
    assert {m["task_id"] for m in result["missing"]} == {"fixture/unrecorded"}
    again = ReplayEnvironment.from_dir(tmp_path / "rec", rewriter=RuleRewriter(), source="torch")
    assert derive_configuration_rows(again, TASKS, configs, into=RewardTable(rewards_dir))["written"] == 0
    cfg = rewards.configuration_name(configs["torch_memory"])
    row = RewardTable(rewards_dir).get(rewards.outcome_key(TASKS[3].hash, cfg, RuleRewriter().identity, 0, 0))
    assert row is not None and row.action == again.outcome(TASKS[3], cfg).action


def test_coverage_leaves_out_a_task_missing_an_action_row(tmp_path):
    """A task with every group but no row for one rule action is left out up front, for that action only:
    ``lacking_actions`` names it, ``left_out`` gives it actions and no groups, the recording's line counts
    it, and every other task is used."""
    shutil.copytree(REPLAY_FIXTURE, tmp_path / "rec")
    rewards_dir = tmp_path / "rec" / "rewards"
    rows = RewardTable(rewards_dir).rows()
    target, dropped = TASKS[1], "channels_last"
    kept = [r for r in rows if (r.task_hash, r.kind, r.action) != (target.hash, "action", dropped)]
    assert len(kept) == len(rows) - 1
    shutil.rmtree(rewards_dir)
    table = RewardTable(rewards_dir)
    table.extend(kept)
    table.flush()
    env = ReplayEnvironment.from_dir(tmp_path / "rec", rewriter=RuleRewriter(), source="torch")
    cov = env.coverage(TASKS)
    assert [t.id for t in cov.used] == [t.id for t in TASKS if t.id != target.id]
    assert cov.lacking_actions == {target.id: (dropped,)} and not cov.lacking_groups
    assert cov.left_out()[target.id]["actions"] == [dropped] and cov.left_out()[target.id]["groups"] == []
    assert f"1 left out (no row for action {dropped}: 1)" in cov.lines()[0]
    used, why = env.fully_recorded(TASKS)
    assert target not in used and why == {target.id: [f"action {dropped}"]}


def test_relative_timing_lock_becomes_absolute():
    """Workers run in their own temp dirs: a relative timing_lock would not be found there."""
    from autoprofiler.evaluation import EvalConfig

    path = EvalConfig(device="cpu", timing_lock="rec/.timing.lock").timing_lock
    assert Path(path).is_absolute() and path.endswith("rec/.timing.lock")
