"""The device-call planner (bench/device_plan.py), its runner (bench/device_next.sh, dry) and unpacker."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import load_script

BENCH = Path(__file__).resolve().parents[1] / "bench"
plan_mod = load_script(BENCH / "device_plan.py")


def write_recording(folder: Path, groups: dict[str, int], actions: dict[str, list[str]]) -> None:
    """A recording's two tables: ``groups[task]`` ncu groups profiled, ``actions[task]`` rule-v1 rows."""
    names = sorted(plan_mod.NCU_GROUPS)
    prof = [(t, g) for t, n in groups.items() for g in names[:n]]
    (folder / "profiles").mkdir(parents=True)
    (folder / "rewards").mkdir(parents=True)
    pq.write_table(
        pa.table({"task_id": [t for t, _ in prof], "group": [g for _, g in prof]}),
        folder / "profiles" / "part-0.parquet",
    )
    rows = [(t, a) for t, acts in actions.items() for a in acts]
    pq.write_table(
        pa.table(
            {
                "task_id": [t for t, _ in rows] + ["a"],
                "kind": ["action"] * len(rows) + ["configuration"],
                "rewriter": ["rule-v1"] * len(rows) + ["rule-v2"],
                "action": [a for _, a in rows] + ["sdpa"],  # a configuration row is no action row
            }
        ),
        folder / "rewards" / "part-0.parquet",
    )


def write_reach(path: Path, reach: dict[str, list[str]]) -> None:
    per_task = [{"task": t, "reachable": r} for t, r in reach.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"results": [{"rewriter": "playbook-v1", "per_task": per_task}]}))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A repository root: an H200 recording of tasks a (complete) and b (3 groups), one suite task complete
    (a many-kernel one), and a reachability report asking for sdpa on a."""
    rule = list(plan_mod.RULE_ACTIONS)
    write_recording(tmp_path / "datasets/recorded/h200", {"a": 10, "b": 3}, {"a": rule, "b": rule[:2]})
    write_recording(
        tmp_path / "datasets/h200_suite", {"suite/l3/mlp_block": 10}, {"suite/l3/mlp_block": rule}
    )
    write_reach(tmp_path / "bench/results/rewriter_reachability_h200.json", {"a": ["torch_compile", "sdpa"]})
    return tmp_path


def test_the_h200_plan_records_until_the_target_then_the_playbook_then_the_suite(tree: Path):
    steps = plan_mod.plan("h200", tree, target=3)
    assert [s for s, _ in steps] == ["record", "playbook", "suite_range"]
    assert "2 of 3 H200 tasks complete (suite 1, generated 1)" in steps[0][1]
    assert steps[1][1].startswith("1 reachable playbook cells")  # sdpa on a; torch_compile is recorded
    missing = (len(plan_mod.MANY_KERNEL_TASKS) - 1) * len(plan_mod.NCU_GROUPS)
    assert steps[2][1].startswith(f"{missing} group profiles")
    # the target met and the cell recorded: the suite's profiles are what is left
    assert [s for s, _ in plan_mod.plan("h200", tree, target=2)] == ["playbook", "suite_range"]
    write_reach(tree / "bench/results/rewriter_reachability_h200.json", {"a": ["torch_compile"]})
    assert [s for s, _ in plan_mod.plan("h200", tree, target=2)] == ["suite_range"]


def test_an_h100_plan_ends_with_its_recording_and_has_no_suite_step(tree: Path):
    assert [s for s, _ in plan_mod.plan("h100", tree)] == ["record"]  # no H100 recording yet
    write_reach(tree / "bench/results/rewriter_reachability_h100.json", {"c": ["keep", "sdpa"]})
    assert [s for s, _ in plan_mod.plan("h100", tree)] == ["playbook", "record"]


def test_a_card_without_a_recording_is_one_line_error(capsys):
    assert plan_mod.card_of("NVIDIA H100 80GB HBM3") == "h100"
    assert plan_mod.main(["Tesla T4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'Tesla T4'" in err


def fake_bin(tmp_path: Path, gpu: str) -> dict:
    """An environment whose ``nvidia-smi`` names ``gpu`` and whose ``python3`` is this interpreter."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f'#!/bin/sh\necho "{gpu}"\n')
    (bin_dir / "nvidia-smi").chmod(0o755)
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_device_next_runs_the_plan_in_order_with_the_time_left(tree: Path, tmp_path: Path):
    (tree / "bench").mkdir(exist_ok=True)
    for name in ("device_next.sh", "device_plan.py", "h200_record_playbook.py"):
        shutil.copy(BENCH / name, tree / "bench" / name)
    out = tmp_path / "out"
    env = {**fake_bin(tmp_path, "NVIDIA H200"), "DRY_RUN": "1", "OUT": str(out), "SECONDS_LEFT": "400"}
    run = subprocess.run(["bash", "bench/device_next.sh"], cwd=tree, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert (out / "gpu.txt").read_text().strip() == "NVIDIA H200"
    record = (out / "1_record" / "step.log").read_text()
    assert "SAME_SHA_OK=0" in record and "h200_record_generated.sh" in record
    assert 350 <= int(re.search(r"SECONDS_LEFT=(\d+)", record).group(1)) <= 400
    playbook = (out / "2_playbook" / "step.log").read_text()
    assert "SAME_SHA_OK=1" in playbook and "TARGET=generated" in playbook and "playbook.sh all" in playbook
    assert "h200_session_d.sh record" in (out / "3_suite_range" / "step.log").read_text()
    # too little time: no step starts
    env["SECONDS_LEFT"] = "100"
    shutil.rmtree(out)
    run = subprocess.run(["bash", "bench/device_next.sh"], cwd=tree, env=env, capture_output=True, text=True)
    assert run.stdout.count("not started") == 3 and not list(out.glob("*/step.log"))
    # another card than the one required: nothing runs
    env.update(SECONDS_LEFT="400", REQUIRE_GPU="H100")
    shutil.rmtree(out)
    run = subprocess.run(["bash", "bench/device_next.sh"], cwd=tree, env=env, capture_output=True, text=True)
    assert run.returncode == 0 and "nothing run" in run.stdout and not (out / "plan.txt").exists()


def pack(tarball: Path, root: Path, files: dict[str, str]) -> None:
    """Write ``files`` under ``root`` and pack its ``datasets`` folder as ``tar czf`` would (folders too)."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(root / "datasets", arcname="datasets")


def test_device_unpack_unpacks_the_steps_in_order_and_keeps_their_logs(tmp_path: Path):
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    for name in ("device_unpack.sh", "unpack_recording.sh"):
        shutil.copy(BENCH / name, repo / "bench" / name)
    stale = repo / "datasets/recorded/h100/profiles/stale.parquet"
    stale.parent.mkdir(parents=True)
    stale.write_text("a part the device compacted away")
    files = tmp_path / "files"
    for n, step in ((1, "record"), (2, "playbook"), (10, "record")):
        (files / f"{n}_{step}" / "r").mkdir(parents=True)
    rec = "datasets/recorded/h100"
    pack(
        files / "1_record/rec.tgz",
        tmp_path / "s1",
        {f"{rec}/profiles/p.parquet": "1", f"{rec}/rewards/r.parquet": "1"},
    )
    pack(
        files / "2_playbook/rec.tgz",
        tmp_path / "s2",
        {f"{rec}/profiles/p.parquet": "2", f"{rec}/rewards/r.parquet": "2"},
    )
    (files / "1_record/step.log").write_text("step one")
    (files / "1_record/record_generated.log").write_text("recorder")
    (files / "2_playbook/r/record_playbook_cheap.log").write_text("cheap stage")
    (files / "gpu.txt").write_text("NVIDIA H100 80GB HBM3\n")
    run = subprocess.run(
        ["bash", "bench/device_unpack.sh", str(files), "t1"], cwd=repo, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    assert (repo / rec / "profiles/p.parquet").read_text() == "2"  # the later step's whole recording
    assert not stale.exists()
    logs = sorted(p.name for p in (repo / rec / "logs").iterdir())
    assert logs == [
        "device_t1_1_record.log",
        "device_t1_1_record_record_generated.log",
        "device_t1_2_playbook_record_playbook_cheap.log",
    ]
    assert run.stdout.index("1_record") < run.stdout.index("2_playbook") < run.stdout.index("10_record")
    (files / "gpu.txt").unlink()
    run = subprocess.run(
        ["bash", "bench/device_unpack.sh", str(files), "t2"], cwd=repo, capture_output=True, text=True
    )
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "gpu.txt" in run.stderr
