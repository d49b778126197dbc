"""autoprofiler/workflow.py: stray options, run folders, paths, the config line and the exit codes, on a
tiny hand-made schema (the shipped configs are tested with their scripts in test_workflows.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from autoprofiler import workflow
from autoprofiler.workflow import ConfigError, EnvironmentProblem

SCHEMA = """\
out_dir: runs/x
filter: []
device: cpu
learn: {confidence: 0.9, margin: 0.0}
runtime: {ray: true, workers: null, concurrency: 1}
"""


@pytest.fixture
def schema(tmp_path) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(SCHEMA)
    return path


def problems(schema: Path, *argv: str, **kwargs) -> list[str]:
    with pytest.raises(ConfigError) as err:
        workflow.load_config(schema, list(argv), nested=("learn", "runtime"), **kwargs)
    return err.value.problems


def test_a_stray_option_is_named_with_the_key_value_it_means(schema):
    """``--filter relu`` is one problem saying ``filter='[relu]'``; an unknown option names the close key;
    a typo in a nested key names the one meant; all reported together."""
    found = problems(schema, "--filter", "relu", "--devcie=cuda", "learn.confidnce=0.9", "device=gpu0")
    assert found[:2] == [
        "--filter: not an option; workflows take key=value overrides, e.g. filter='[relu]'",
        "--devcie: unknown option (did you mean device?) (options: --config FILE, --resume, --overwrite; "
        "settings are key=value with keys out_dir, filter, device, learn, runtime)",
    ]
    assert "unknown key 'confidnce' in learn (did you mean confidence?)" in found[2]
    assert len(found) == 3  # device=gpu0 is a string: the schema's type, left to the script's checks


def test_flags_and_overrides_mix_in_any_order(schema):
    """--resume between overrides; values are YAML; a negative number is a value, not an option."""
    cfg = workflow.load_config(schema, ["filter=[a, b]", "--resume", "learn.margin=-0.5"], nested=("learn",))
    assert cfg["filter"] == ["a", "b"] and cfg["resume"] and not cfg["overwrite"]
    assert cfg["learn"] == {"confidence": 0.9, "margin": -0.5}
    assert "pass one of them" in problems(schema, "--resume", "--overwrite")[0]


def test_out_dir_is_refused_unless_resumed_or_overwritten(tmp_path):
    """A folder holding a run: refused with both ways out named; --resume takes it; --overwrite replaces
    only a folder a workflow wrote (config.json) and empties it; an empty or new folder is taken."""
    out = tmp_path / "run"
    assert workflow.out_dir_problems({"out_dir": str(out)}) == []
    out.mkdir()
    assert workflow.out_dir_problems({"out_dir": str(out)}) == []
    (out / "notes.txt").write_text("mine")
    (refused,) = workflow.out_dir_problems({"out_dir": str(out)})
    assert "already holds a run (notes.txt)" in refused and "--resume" in refused and "--overwrite" in refused
    assert workflow.out_dir_problems({"out_dir": str(out), "resume": True}) == []
    (kept,) = workflow.out_dir_problems({"out_dir": str(out), "overwrite": True})
    assert "no config.json (not a run folder)" in kept
    (out / "config.json").write_text("{}")
    cfg = {"out_dir": str(out), "overwrite": True}
    assert workflow.out_dir_problems(cfg) == []
    assert workflow.prepare_out_dir(cfg) == out and list(out.iterdir()) == []


def test_overwrite_never_removes_the_current_folder(tmp_path, monkeypatch):
    """out_dir=. with --overwrite, even holding a config.json, is refused."""
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    (problem,) = workflow.out_dir_problems({"out_dir": ".", "overwrite": True})
    assert "never replaced" in problem


def test_relative_paths_resolve_from_here_then_the_repository(tmp_path, monkeypatch):
    """A config's relative path: the current folder's when it is there, else the repository's."""
    monkeypatch.chdir(tmp_path)
    assert workflow.resolve_path("datasets/suite") == workflow.REPO / "datasets" / "suite"
    (tmp_path / "datasets" / "suite").mkdir(parents=True)
    assert workflow.resolve_path("datasets/suite") == Path("datasets/suite")
    assert workflow.resolve_path("runs/new") == Path("runs/new")


def test_config_line_is_short():
    """The line a script prints: where the config is, and the named keys (long lists counted)."""
    cfg = {"device": "cpu", "filter": list("abcdef"), "tree": "lone:x", "eval": {"timing_trials": 3}}
    line = workflow.config_line(Path("runs/x/config.json"), cfg, ["device", "filter", "tree", "nope"])
    assert line == "config: runs/x/config.json (device=cpu filter=[6 items] tree=lone:x)"


def test_run_main_maps_problems_to_exit_codes(capsys):
    """ConfigError: exit 2, a line per problem; EnvironmentProblem: exit 3, one line; success passes."""

    def bad_config(argv):
        raise ConfigError(["a: wrong", "b: worse"])

    def no_gpu(argv):
        raise EnvironmentProblem("device=cuda: no CUDA here;\n  set device=cpu")

    assert workflow.run_main(bad_config, []) == 2
    assert capsys.readouterr().err == "error: invalid config:\n  - a: wrong\n  - b: worse\n"
    assert workflow.run_main(no_gpu, []) == 3
    assert capsys.readouterr().err == "error: device=cuda: no CUDA here; set device=cpu\n"
    assert workflow.run_main(lambda argv: len(argv), ["x", "y"]) == 2


def test_environment_problems_before_anything_starts(monkeypatch):
    """No CUDA for device=cuda, no ncu for source=ncu: named with the fix; joining a cluster: not judged
    here (the cluster's workers have the GPUs)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(workflow, "_cuda_here", lambda: False)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "torch sees no CUDA device" in workflow.environment_problem("cuda", "torch", {"ray": False})
    assert "ncu is not on PATH" in workflow.environment_problem("cpu", "ncu", {"ray": False})
    assert workflow.environment_problem("cpu", "torch", {"ray": False}) is None
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert workflow.environment_problem("cuda", "ncu", {"ray": True}) is None
    assert os.environ["RAY_ADDRESS"]


def test_an_environment_error_raised_in_a_ray_actor_prints_its_own_message(capsys):
    """No ncu on a worker reaches the driver as Ray's RayTaskError (also an NcuNotFound): exit 3 with the
    cause's one line, not the remote traceback."""
    from ray.exceptions import RayTaskError

    from autoprofiler.profiling import NcuNotFound

    cause = NcuNotFound("Nsight Compute executable 'ncu' not found; install Nsight Compute")
    remote = RayTaskError("CellWorker.profile", "Traceback (most recent call last):\n  File ...", cause)

    def main(argv):
        raise remote.as_instanceof_cause()

    assert workflow.run_main(main, []) == 3
    assert capsys.readouterr().err == f"error: {cause}\n"
