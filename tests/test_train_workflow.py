"""workflows/train.py: the shipped config, config errors, and the real script on tiny inputs (subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "workflows" / "train.py"
FIXTURE = REPO / "tests" / "fixtures" / "replay"
LIVE = ["--config", str(REPO / "workflows" / "train_cpu_live.yaml")]  # the live CPU run's config


def _train_module():
    return load_script(SCRIPT, "train_workflow")


def run(*args: str, timeout: float = 240, expect: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert proc.returncode == expect, (
        f"train.py exited {proc.returncode}, expected {expect}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    return proc


def replay_args(out: Path) -> list[str]:
    """The replay fixture (torch source) over the live config's other settings."""
    return [
        *LIVE,
        "environment=replay",
        f"tables={FIXTURE}",
        f"tasks={FIXTURE / 'tasks'}",
        "task_filter=[]",
        "max_tasks=0",
        f"out_dir={out}",
    ]


def test_shipped_config_loads_and_opens_with_its_command():
    """workflows/train.yaml validates and its first line gives the command that runs it."""
    cfg = _train_module().read_config([])
    first = (REPO / "workflows" / "train.yaml").read_text().splitlines()[0]
    assert first.startswith("# python workflows/train.py")
    assert cfg["environment"] in ("live", "replay", "auto") and cfg["learn"]["confidence"] == 0.9
    assert cfg["learn"]["error_control"] == "run"  # confidence bounds the whole run's false accepts


def test_config_problems_are_reported_together():
    """Unknown keys, wrong types and bad values are all named in one error."""
    from autoprofiler.workflow import ConfigError

    with pytest.raises(ConfigError) as e:
        _train_module().read_config(["nope=1", "max_tasks=many", "environment=cloud", "tree.x=1"])
    msg = str(e.value)
    assert all(s in msg for s in ("'nope'", "max_tasks", "environment", "'tree' is not a nested section"))
    with pytest.raises(ConfigError, match="error_control: expected one of \\['run', 'decision'\\]"):
        _train_module().read_config(["learn.error_control=family"])


def test_the_tree_probes_and_tasks_are_checked_before_any_work():
    """An ncu tree with source=torch, a probe of the other source, a learn typo and a missing task
    folder: one ConfigError naming each, each with what to do (the issue's tracebacks after 15 s)."""
    from autoprofiler.workflow import ConfigError

    with pytest.raises(ConfigError) as e:
        _train_module().read_config(
            [*LIVE, "tree=trees/seed.json", "probe=[memory]", "learn.confidnce=0.9", "tasks=datasets/nope"]
        )
    found = e.value.problems
    assert len(found) == 4, found
    assert any("unknown key 'confidnce' in learn (did you mean confidence?)" in p for p in found)
    assert any(p.startswith("tasks: 'datasets/nope' does not load") for p in found)
    assert any(p.startswith("probe: ['memory'] are not torch configurations") for p in found)
    assert any("routes on ncu profiles, but source='torch'; pass source=ncu" in p for p in found)
    with pytest.raises(ConfigError, match="training needs at least 2"):
        _train_module().read_config([*LIVE, "task_filter=[relu]"])


def test_overrides_are_typed_and_nested():
    """key=value values are YAML; dotted keys set one field of a nested section."""
    cfg = _train_module().read_config(
        [*LIVE, "learn.confidence=0.8", "max_tasks=3", "probe=[torch_memory]", "--resume"]
    )
    assert cfg["learn"]["confidence"] == 0.8 and cfg["learn"]["method"] == "t"
    assert cfg["max_tasks"] == 3 and cfg["probe"] == ["torch_memory"] and cfg["resume"] is True


def test_replay_run_writes_tree_log_evaluation_and_report(tmp_path):
    """On the replay fixture the script learns, judges on held-out tasks and writes every output."""
    out = tmp_path / "run"
    proc = run(*replay_args(out))
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"config: {out}/config.json (environment=replay ") and len(first) < 300
    for name in (
        "config.json",
        "tree.json",
        "proposals.jsonl",
        "state.json",
        "evaluation.json",
        "oracle.json",
        "report/report.md",
        "report/policy_speedup.png",
        "report/tree.png",
    ):
        assert (out / name).exists(), name
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["environment"] == "replay" and cfg["out_dir"] == str(out)
    ev = json.loads((out / "evaluation.json").read_text())
    assert {"blind", "learned_tree", "seed_tree", "oracle", "random"} <= set(ev["summary"])
    assert "best static configuration" in ev["verdict"] and ev["verdict"] in proc.stdout
    ratio = ev["learned_over_best_static"]  # the paired interval the verdict is read from
    s = ev["summary"]
    assert ratio["estimate"] == pytest.approx(
        s["learned_tree"]["geomean_speedup"] / s[f"static:{ev['best_static_on_train']}"]["geomean_speedup"]
    )
    assert ratio["low"] <= ratio["estimate"] <= ratio["high"] and ratio["n"] == ev["tasks"]
    assert ("does NOT beat" in ev["verdict"]) == (ratio["low"] <= 1.0)
    gain = ev["learned_over_seed"]  # what learning bought over the seed tree, held out
    assert gain["estimate"] == pytest.approx(
        s["learned_tree"]["geomean_speedup"] / s["seed_tree"]["geomean_speedup"]
    )
    assert ("Learned / seed tree" in ev["verdict"]) == bool(ev["learner"]["accepted"])
    assert ev["summary"]["oracle"]["geomean_speedup"] >= ev["summary"]["learned_tree"]["geomean_speedup"]
    report = (out / "report" / "report.md").read_text()
    assert f"restricted to the {ev['tasks'] + ev['train_tasks']} tasks of this run" in report
    again = run(*replay_args(out), expect=2, timeout=60)  # the same out_dir again: refused, nothing touched
    assert (
        "already holds a run" in again.stderr and "--resume" in again.stderr and "--overwrite" in again.stderr
    )


def test_experience_rewriter_is_fitted_on_the_training_tasks_only(tmp_path):
    """rewriter=experience on the replay fixture: fitted once the split is known, on training tasks only
    (its identity counts them), then learns and judges like any rewriter; it needs a replay."""
    out = tmp_path / "run"
    proc = run(*replay_args(out), "rewriter=experience", "rewriter_options={k: 2}")
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("rewriter: experience-v1"))
    ev = json.loads((out / "evaluation.json").read_text())
    fitted = int(line.split("fitted on ")[1].split()[0])
    assert "[k=2,source=torch," in line and fitted == ev["train_tasks"] < ev["train_tasks"] + ev["tasks"]
    assert ",actions=" in line and "choosing among keep" in line
    assert {"blind", "learned_tree", "oracle"} <= set(ev["summary"])
    bad = run(*LIVE, "rewriter=experience", f"out_dir={tmp_path / 'live'}", expect=2, timeout=60)
    assert "experience is fitted on a recording's training tasks; it needs a replay" in bad.stderr


def test_a_rewriter_whose_actions_are_unrecorded_is_one_clear_error(tmp_path):
    """rewriter=playbook on a recording of the rule actions only: no task is usable, and the output names
    the playbook's unrecorded actions and what to do, then one config error (exit 2, no traceback)."""
    proc = run(*replay_args(tmp_path / "run"), "rewriter=playbook", expect=2, timeout=120)
    hint = next(ln for ln in proc.stdout.splitlines() if ln.startswith("replay: no task has a reward row"))
    assert "compile_max_autotune" in hint and "sdpa" in hint and "rewriter=rule" in hint
    assert "tasks: 0 usable" in proc.stderr


def test_the_default_config_replays_the_committed_recordings():
    """No flags: the replay (ncu profiles) of the committed recordings (the two H200 ones first, then the
    H100's tasks the H200 has no row of) over both task sources; ``tests/test_multisource.py`` runs it."""
    cfg = _train_module().read_config([])
    assert (cfg["environment"], cfg["source"], cfg["rewriter"]) == ("replay", "ncu", "rule")
    assert cfg["tables"] == ["datasets/h200_suite", "datasets/recorded/h200", "datasets/recorded/h100"]
    assert cfg["tasks"] == ["datasets/suite", "datasets/ops_gen/tasks.parquet"]


def test_live_config_loads_and_opens_with_its_command():
    """workflows/train_cpu_live.yaml validates and names the command that runs it on its first line."""
    path = REPO / "workflows" / "train_cpu_live.yaml"
    first = path.read_text().splitlines()[0]
    assert first == "# python workflows/train.py --config workflows/train_cpu_live.yaml"
    cfg = _train_module().read_config(["--config", str(path)])
    assert cfg["environment"] == "live" and cfg["source"] == "torch" and cfg["device"] == "cpu"


def test_resume_continues_the_log(tmp_path):
    """A run stopped after one decision and resumed with --resume continues the same log.

    Per-decision control at 0.2: on this split's 5 acceptance tasks the fixture's split changes 3, all for
    the better (exact evidence 1/8), which clears 0.2 per decision but neither 0.1 nor the run-level share
    0.1 / 12 of train.yaml; the resume needs an accept to continue from."""
    out = tmp_path / "run"
    lone = [
        "tree=tests/fixtures/replay/lone_leaf.json",
        "learn.error_control=decision",
        "learn.confidence=0.8",
    ]
    run(*replay_args(out), *lone, "learn.max_decisions=1", "runtime.ray=false")
    assert len((out / "proposals.jsonl").read_text().splitlines()) == 1
    run(*replay_args(out), *lone, "--resume", "runtime.ray=false")
    log = [json.loads(x) for x in (out / "proposals.jsonl").read_text().splitlines()]
    assert [d["decision"] for d in log] == list(range(len(log))) and len(log) > 1
    assert any(d["accepted"] and d["operator"] == "SPLIT" for d in log)


def test_live_cpu_run_on_three_tasks(tmp_path):
    """The live path for real: torch.profiler, rule rewriter, sandboxed evaluator, 3 tiny suite tasks."""
    out = tmp_path / "live"
    run(
        "--config",
        "workflows/train_cpu_live.yaml",
        f"out_dir={out}",
        "task_filter=[matmul_square, matvec, matmul_batched]",
        "max_tasks=3",
        "eval.timing_trials=5",
        "eval.correctness_trials=1",
        "eval.warmup=1",
        "refinement_rounds=2",
        timeout=300,
    )
    from autoprofiler.tables import read_table

    rows = read_table(out / "tables" / "rewards", "reward").to_pylist()
    assert rows and all(r["device"] == "cpu" and r["profile_source"] == "torch" for r in rows)
    assert len({r["key"] for r in rows}) == len(rows)
    profiles = read_table(out / "tables" / "profiles", "profile").to_pylist()
    assert {p["group"] for p in profiles} == {
        "torch_root",
        "torch_ops",
        "torch_memory",
        "torch_flops",
        "torch_launch",
    }
    ev = json.loads((out / "evaluation.json").read_text())
    assert ev["environment"] == "live" and ev["tasks"] >= 1
    assert (out / "report" / "report.md").exists()
    refinement = json.loads((out / "refinement.json").read_text())["rows"]
    assert {r["round"] for r in refinement} == {0, 1}  # round 1 ran live on the best program so far
