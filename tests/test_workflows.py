"""workflows/oracle_sweep.py, rule_sweep.py and evaluate.py: shipped configs, config and environment errors,
and the real scripts on tiny inputs (subprocesses, ``runtime.ray=false``: no Ray start in these tests;
``tests/test_job_submit.py`` runs one under ``ray job submit``).

GPU: ``python -m pytest tests/test_workflows.py -m gpu -s`` runs every rule action on suite tasks on CUDA
(``AUTOPROFILER_RULE_GPU_TASKS``: a YAML list of task names, or ``all``; ``AUTOPROFILER_RESULTS_DIR``:
where the tables go, default a temp dir).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPLAY_FIXTURE, load_script

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / "workflows"
TINY_EVAL = ["eval.timing_trials=3", "eval.warmup=1", "eval.correctness_trials=1"]
TORCH_PROBE = "probe=[torch_algorithm, torch_memory, torch_latency, torch_compute]"


def workflow_module(name: str):
    """``workflows/<name>.py`` imported as a module (its ``read_config`` and helpers)."""
    return load_script(WORKFLOWS / f"{name}.py", f"workflow_{name}")


def run(name: str, *args: str, expect: int = 0, timeout: float = 240) -> subprocess.CompletedProcess:
    """``python workflows/<name>.py args...``; asserts the exit code and that no traceback was printed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, str(WORKFLOWS / f"{name}.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    output = f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.returncode == expect, f"{name}.py exited {proc.returncode}, expected {expect}:\n{output}"
    assert "Traceback" not in proc.stdout + proc.stderr, output
    return proc


# --- shipped configs ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, config, command",
    [
        ("oracle_sweep", "oracle_sweep.yaml", "# python workflows/oracle_sweep.py"),
        ("oracle_sweep", "oracle_sweep_h200.yaml", "# python3 workflows/oracle_sweep.py --config"),
        ("rule_sweep", "rule_sweep.yaml", "# python workflows/rule_sweep.py"),
        ("evaluate", "evaluate.yaml", "# python workflows/evaluate.py"),
    ],
)
def test_shipped_configs_load_and_open_with_their_command(tmp_path, name, config, command):
    """Every shipped config validates as its script reads it, and its first line is the command."""
    path = WORKFLOWS / config
    assert path.read_text().splitlines()[0].startswith(command)
    argv = ["--config", str(path)] + ([f"out_dir={tmp_path}"] if name == "evaluate" else [])
    cfg = workflow_module(name).read_config(argv)
    assert set(cfg["runtime"]) == {"ray", "workers", "concurrency"}


def test_the_h200_config_runs_in_one_process_with_six_candidates_at_once():
    """The H200 has no Ray: its config runs the sweep in this process, six candidates at once, on ncu."""
    cfg = workflow_module("oracle_sweep").read_config(["--config", str(WORKFLOWS / "oracle_sweep_h200.yaml")])
    assert cfg["runtime"] == {"ray": False, "workers": None, "concurrency": 6}
    assert (cfg["source"], cfg["device"], cfg["task_size"], cfg["filter"]) == ("ncu", "cuda", "full", [])


# --- errors: one line each, all at once, before any work --------------------------------------------------
@pytest.mark.parametrize(
    "name, args, expected",
    [
        (
            "oracle_sweep",
            ["filter=[nope_zzz]", "source=gpu", "actions=[fly]", "seeds=[]", "eval.timing_trials=0", "x=1"],
            ["filter: 'nope_zzz' matches no task", "source:", "actions:", "seeds:", "timing_trials", "'x'"],
        ),
        (
            "rule_sweep",
            ["tasks=datasets/nope", "tf32_tolerance=-1", "actions=keep", "runtime.workers=0"],
            ["tasks: ", "tf32_tolerance:", "actions: expected list", "runtime.workers:"],
        ),
        (
            "evaluate",
            ["environment=cloud", "split=dev", "trees=[nope.json]", "probe=[torch_memory]", "eval.x=1"],
            ["environment:", "split:", "trees: ", "probe: ['torch_memory'] are not ncu", "unknown key 'x'"],
        ),
    ],
)
def test_config_problems_are_reported_together_in_one_line_each(name, args, expected):
    """Several bad values: exit 2, every problem named on its own line, no traceback."""
    proc = run(name, *args, expect=2, timeout=60)
    problems = [line for line in proc.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) >= len(expected), proc.stderr
    for text in expected:
        assert sum(text in line for line in problems) == 1, (text, proc.stderr)


def test_a_filter_that_selects_no_task_is_a_config_error():
    """``filter=[nope_zzz]`` (the issue's example): one line, exit 2, nothing recorded; ``--filter nope_zzz``
    (an option where a key=value belongs) says how to write it."""
    proc = run("oracle_sweep", "filter=[nope_zzz]", "out_dir=runs/never_written", expect=2, timeout=60)
    assert "filter: 'nope_zzz' matches no task" in proc.stderr
    assert not (REPO / "runs" / "never_written").exists()
    proc = run("oracle_sweep", "--filter", "nope_zzz", "out_dir=runs/never_written", expect=2, timeout=60)
    assert "--filter: not an option; workflows take key=value overrides, e.g. filter='[nope_zzz]'" in (
        proc.stderr
    )
    assert not (REPO / "runs" / "never_written").exists()


def test_a_recording_in_out_dir_is_continued_only_when_asked(tmp_path):
    """An out_dir holding a recording: refused (exit 2, naming --resume and --overwrite) before any work;
    with both flags a config error too."""
    out = tmp_path / "rec"
    out.mkdir()
    (out / "config.json").write_text("{}")
    proc = run("oracle_sweep", f"out_dir={out}", "runtime.ray=false", expect=2, timeout=60)
    assert "already holds a run (config.json)" in proc.stderr and "Started a local Ray" not in proc.stderr
    proc = run("oracle_sweep", f"out_dir={out}", "--resume", "--overwrite", expect=2, timeout=60)
    assert "pass one of them" in proc.stderr


def test_cuda_without_a_gpu_is_an_environment_error(tmp_path):
    """``device=cuda`` in this process on a machine without CUDA: exit 3, one line naming the fix."""
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    proc = run(
        "oracle_sweep", f"out_dir={tmp_path}", "device=cuda", "runtime.ray=false", expect=3, timeout=60
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no CUDA device" in errors[0] and "device=cpu" in errors[0]


@pytest.mark.parametrize(
    "name, args",
    [
        ("train", ["environment=live", "tables=null", "device=cuda"]),  # runtime.ray=true: refused before Ray
        ("serve", ["device=cuda", "port=8123"]),
    ],
)
def test_no_cuda_is_one_line_before_ray_starts(tmp_path, name, args):
    """device=cuda without CUDA (the issue's cases; every workflow asks ``environment_problem``, tested in
    test_workflow.py): exit 3 with the fix, before Ray starts (the issue's 156 lines of replica
    tracebacks came from starting it), nothing written."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = [] if name == "serve" else [f"out_dir={tmp_path / 'out'}"]
    proc = run(name, *args, *out, expect=3, timeout=60)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: device=cuda: torch sees no CUDA device"), lines
    assert not (tmp_path / "out").exists()


# --- evaluate.py on the replay fixture --------------------------------------------------------------------
def evaluate_args(out: Path) -> list[str]:
    return [
        f"out_dir={out}",
        f"tables={REPLAY_FIXTURE}",
        f"tasks={REPLAY_FIXTURE / 'tasks'}",
        "source=torch",
        f"trees=[{REPLAY_FIXTURE / 'lone_leaf.json'}]",
        TORCH_PROBE,
        "split=all",
        "runtime.ray=false",
    ]


def test_evaluate_judges_every_policy_on_the_replay_fixture(tmp_path):
    """evaluate.py on the 20-task fixture: every policy summarised, the oracle on top, a report; a second
    run into the same folder is refused unless overwrite=true."""
    out = tmp_path / "eval"
    proc = run("evaluate", *evaluate_args(out), timeout=120)
    ev = json.loads((out / "evaluation.json").read_text())
    policies = {"blind", "random", "tree:lone_leaf", "oracle", "static:torch_memory", "static:torch_latency"}
    assert policies <= set(ev["summary"]) and ev["tasks"] == 20 and ev["split"] == "all"
    assert len(ev["rows"]) == 20 * len(ev["summary"])
    best = max(s["geomean_speedup"] for s in ev["summary"].values())
    assert ev["summary"]["oracle"]["geomean_speedup"] == best
    assert ev["verdict"].startswith("tree:lone_leaf: ") and ev["verdict"] in proc.stdout
    assert "paired bootstrap" in ev["verdict"]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["split"] == "all" and {"git_sha", "torch", "ray"} <= set(cfg["provenance"])
    assert (out / "report" / "report.md").exists()
    again = run("evaluate", *evaluate_args(out), expect=2, timeout=60)
    assert "already holds a run" in again.stderr and "--resume" in again.stderr
    (out / "stale.txt").write_text("from the run before")
    run("evaluate", *evaluate_args(out), "--overwrite", timeout=120)
    assert not (out / "stale.txt").exists() and (out / "evaluation.json").exists()  # replaced whole


# --- oracle_sweep.py ---------------------------------------------------------------------------------------
def test_analyse_only_on_a_recording_writes_the_oracle_readme_and_report(tmp_path):
    """analyse_only on a copy of the replay fixture: the oracle sweep over its 20 tasks, a README that
    describes reward schema 2 (the kind column, no action:<name> configurations), a report."""
    rec = tmp_path / "rec"
    shutil.copytree(REPLAY_FIXTURE, rec)
    run(
        "oracle_sweep",
        f"out_dir={rec}",
        f"tasks={rec / 'tasks'}",
        "filter=[]",
        "source=torch",
        "analyse_only=true",
        f"report_dir={tmp_path / 'report'}",
        timeout=120,
    )
    oracle = json.loads((rec / "oracle.json").read_text())
    assert oracle["tasks"] == 20 and oracle["oracle_geomean"] >= oracle["best_static_geomean"]
    readme = (rec / "README.md").read_text()
    assert "`kind` says what a row is" in readme and "schema version 2" in readme
    assert "action:<" not in readme and "Oracle sweep over 20 tasks" in readme
    assert (tmp_path / "report" / "report.md").exists() and not (rec / "config.json").exists()


def test_a_recording_in_one_process_profiles_evaluates_and_analyses(tmp_path):
    """The GPU machine's path (runtime.ray=false) on one tiny suite task: a profile group, one action
    (evaluated 2 candidates at once), the rows with provenance, the summary and the README."""
    from autoprofiler.tables import read_table

    out = tmp_path / "rec"
    run(
        "oracle_sweep",
        f"out_dir={out}",
        "filter=[relu]",
        "groups=[torch_root]",
        "actions=[keep, channels_last]",
        "configurations=[]",
        *TINY_EVAL,
        "runtime.ray=false",
        "runtime.concurrency=2",
        timeout=180,
    )
    rows = read_table(out / "rewards", "reward").to_pylist()
    assert sorted(r["action"] for r in rows) == ["channels_last", "keep"]
    assert all(r["kind"] == "action" and r["device"] == "cpu" and r["run_id"] for r in rows)
    profiles = read_table(out / "profiles", "profile").to_pylist()
    assert [p["group"] for p in profiles] == ["torch_root"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and summary["evaluations"] == 2 and not summary["failures"]
    assert json.loads((out / "config.json").read_text())["runtime"]["concurrency"] == 2
    assert "rule actions evaluated: channels_last, keep" in (out / "README.md").read_text()


def test_evaluate_only_records_the_actions_and_summarises_them(tmp_path):
    """evaluate_only: the rule actions' rows and no profiles; the analysis, which needs profiles, gives
    way to each action's summary (it was a traceback)."""
    from autoprofiler.tables import read_table

    out = tmp_path / "rec"
    proc = run(
        "oracle_sweep",
        f"out_dir={out}",
        "filter=[relu]",
        "evaluate_only=true",
        "actions=[keep, channels_last]",
        *TINY_EVAL,
        "runtime.ray=false",
        timeout=180,
    )
    rows = read_table(out / "rewards", "reward").to_pylist()
    assert sorted(r["action"] for r in rows) == ["channels_last", "keep"]
    assert not (out / "profiles").exists()
    assert "no oracle analysis" in proc.stdout and "  keep: 1 tasks" in proc.stdout


# --- rule_sweep.py ------------------------------------------------------------------------------------------
def test_rule_sweep_table_and_summary_from_hand_made_rows():
    """Per-action counts and geomeans (effective: a failure counts 1.0; a missing cell counts as an
    evaluation without an answer), and the Markdown tables."""
    base = {"error_kind": None, "error": "", "missing": ""}
    rows = [
        {**base, "task": "a", "action": "keep", "correct": True, "speedup": 1.0, "effective_speedup": 1.0},
        {
            **base,
            "task": "a",
            "action": "cuda_graph",
            "correct": True,
            "speedup": 4.0,
            "effective_speedup": 4.0,
        },
        {
            **base,
            "task": "b",
            "action": "cuda_graph",
            "correct": False,
            "error_kind": "runtime_error",
            "error": "capture failed | sync",
            "speedup": None,
            "effective_speedup": 1.0,
        },
        {**base, "task": "c", "action": "cuda_graph", "correct": False, "missing": "yes", "error": "lost"},
    ]
    module = workflow_module("rule_sweep")
    summary = {s["action"]: s for s in module.summarize_actions(rows).to_dicts()}
    graph = summary["cuda_graph"]
    assert (graph["evaluated"], graph["answered"], graph["correct"]) == (3, 2, 1)
    assert graph["geomean_speedup_correct"] == pytest.approx(4.0)
    assert graph["geomean_speedup"] == pytest.approx(4.0 ** (1 / 3))
    assert list(summary) == ["keep", "cuda_graph"]
    text = module.render_markdown(rows, "t")
    assert text.startswith("# t\n\n| task | action | correct | speedup | ref ms | new ms | error |\n")
    assert "| b | cuda_graph | no |  |  |  | runtime_error: capture failed / sync |" in text
    assert "| cuda_graph | 3 | 2 | 1 | 0.333 | 1.587 | 4.000 | 0.333 |" in text


def test_rule_sweep_runs_actions_and_a_loose_tf32(tmp_path):
    """rule_sweep.py on one tiny suite task: keep and tf32 (also at 1e-2, in a table of its own), two at
    once in this process; keep passes."""
    out = tmp_path / "rules"
    args = [f"out_dir={out}", "filter=[relu]", "actions=[keep, tf32]", *TINY_EVAL, "runtime.ray=false"]
    run("rule_sweep", *args, "runtime.concurrency=2", timeout=180)
    data = json.loads((out / "rule_actions.json").read_text())
    assert [r["action"] for r in data["rows"]] == ["keep", "tf32", "tf32@0.01"]
    assert data["rows"][0]["correct"] and data["provenance"]["device"] == "cpu"
    assert (out / "tables" / "rewards").is_dir() and (out / "tables_tf32_tol0.01" / "rewards").is_dir()
    assert "| keep | 1 | 1 | 1 | 1.000 |" in (out / "rule_actions.md").read_text()


@pytest.mark.gpu
def test_every_rule_action_on_cuda():
    """Every action on a few suite tasks on CUDA (tf32 also at 1e-2), three at once; keep passes
    everywhere and every other action passes somewhere."""
    import yaml

    default = (
        "[l1/matmul_square, l1/conv2d, l1/tiny_add, l2/linear_gelu, l2/swish_chain, l3/resnet_basic_block]"
    )
    wanted = yaml.safe_load(os.environ.get("AUTOPROFILER_RULE_GPU_TASKS", default))
    out = Path(os.environ.get("AUTOPROFILER_RESULTS_DIR") or tempfile.mkdtemp(prefix="rule_actions_"))
    run(
        "rule_sweep",
        f"out_dir={out}",
        f"filter={[] if wanted == 'all' else wanted}",
        "actions=[]",
        "device=cuda",
        "task_size=full",
        "eval.timing_trials=50",
        "runtime.ray=false",
        "runtime.concurrency=3",
        timeout=1800,
    )
    rows = json.loads((out / "rule_actions.json").read_text())["rows"]
    failed_keep = [r for r in rows if r["action"] == "keep" and not r["correct"]]
    assert not failed_keep, failed_keep
    for label in ("torch_compile", "cuda_graph", "channels_last", "tf32@0.01"):
        assert any(r["correct"] for r in rows if r["action"] == label), f"{label} passed on no task"


def test_git_state_comes_from_what_the_sender_set(monkeypatch, tmp_path):
    """A copy of the tree (the GPU machine's): the sha and dirty flag the sender put in
    AUTOPROFILER_GIT_SHA / AUTOPROFILER_GIT_DIRTY, even in a checkout (whose .git may be stale there);
    none set: the checkout's own, or unknown outside git."""
    from autoprofiler import provenance

    monkeypatch.setattr(provenance, "_PACKAGE_DIR", tmp_path / "autoprofiler")
    monkeypatch.setenv("AUTOPROFILER_GIT_SHA", "0123456789abcdef")
    monkeypatch.setenv("AUTOPROFILER_GIT_DIRTY", "0")
    provenance.git_state.cache_clear()
    try:
        assert provenance.git_state() == ("0123456789ab", False)
        monkeypatch.delenv("AUTOPROFILER_GIT_SHA")
        provenance.git_state.cache_clear()
        assert provenance.git_state() == ("", None)
        monkeypatch.undo()
        monkeypatch.delenv("AUTOPROFILER_GIT_SHA", raising=False)
        provenance.git_state.cache_clear()
        own, _ = provenance.git_state()
        assert len(own) == 12  # this checkout's own sha
        monkeypatch.setenv("AUTOPROFILER_GIT_SHA", "feedface")
        monkeypatch.setenv("AUTOPROFILER_GIT_DIRTY", "1")
        provenance.git_state.cache_clear()
        assert provenance.git_state() == ("feedface", True)  # the sender's word wins over the checkout
    finally:
        provenance.git_state.cache_clear()
