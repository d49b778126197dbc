"""Task loaders: every loader on the fixtures under datasets/fixtures, every malformed case, and
that loading executes nothing."""

import json
import pickle
import shutil
from pathlib import Path

import pytest

from autoprofiler.tasks import (
    LoadReport,
    Task,
    TaskLoadError,
    content_hash,
    load_kernelbench,
    load_ops_table,
    load_task_file,
    load_task_folder,
    load_tasks,
    read_header,
)

FIXTURES = Path(__file__).resolve().parents[1] / "datasets" / "fixtures"
FOLDER = FIXTURES / "task_folder"
KERNELBENCH = FIXTURES / "kernelbench"


def test_load_task_file_fills_every_field():
    """A good file loads with id, source, hash, level, tags and origin filled in."""
    task = load_task_file(FOLDER / "good_relu.py", id="x/relu")
    assert task.id == "x/relu"
    assert task.source == (FOLDER / "good_relu.py").read_text()
    assert task.hash == content_hash(task.source) and len(task.hash) == 16
    assert task.level == 1
    assert task.tags == ("elementwise", "fixture")
    assert task.origin == str(FOLDER / "good_relu.py")


def test_load_task_file_defaults_and_overrides():
    """No id: the stem is used; explicit level and tags win over the header; folder l2 gives level 2."""
    assert load_task_file(FOLDER / "good_relu.py").id == "good_relu"
    task = load_task_file(FOLDER / "header_level.py", level=2, tags=("a",))
    assert (task.level, task.tags) == (2, ("a",))
    assert load_task_file(FOLDER / "header_level.py").level == 3
    assert load_task_file(FOLDER / "l2" / "fused.py").level == 2


@pytest.mark.parametrize(
    "name, reason",
    [
        ("bad_syntax.py", "syntax error at line 5"),
        ("bad_no_model.py", "missing class Model"),
        ("bad_no_get_inputs.py", "missing module-level function get_inputs"),
        ("bad_no_get_init_inputs.py", "missing module-level function get_init_inputs"),
    ],
)
def test_malformed_file_raises_with_path_and_reason(name, reason):
    """Each malformed case raises TaskLoadError naming the file and the problem."""
    with pytest.raises(TaskLoadError) as info:
        load_task_file(FOLDER / name)
    assert info.value.path == str(FOLDER / name)
    assert reason in info.value.reason
    assert str(FOLDER / name) in str(info.value)


def test_missing_file_is_a_load_error(tmp_path):
    """An unreadable path is a TaskLoadError, not an OSError."""
    with pytest.raises(TaskLoadError, match="cannot read"):
        load_task_file(tmp_path / "nope.py")


def test_loading_executes_nothing(tmp_path):
    """A file that writes a marker and raises at import still loads, and the marker never appears."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    shutil.copy(FOLDER / "side_effects.py", folder / "side_effects.py")
    task = load_task_file(folder / "side_effects.py")
    report = load_task_folder(folder)
    load_tasks(folder / "side_effects.py")
    assert task.tags == ("fixture", "side-effects")
    assert [t.id for t in report] == ["tasks/side_effects"]
    assert not (folder / "EXECUTED_MARKER").exists()


def test_load_task_folder_reports_malformed_and_loads_the_rest():
    """The fixture folder: 4 good tasks (sorted, ids prefixed by folder name), 4 errors, _helper skipped."""
    report = load_task_folder(FOLDER)
    assert [t.id for t in report] == [
        "task_folder/good_relu",
        "task_folder/header_level",
        "task_folder/l2/fused",
        "task_folder/side_effects",
    ]
    assert [t.level for t in report] == [1, 3, 2, 1]
    assert sorted(Path(e.path).name for e in report.errors) == [
        "bad_no_get_init_inputs.py",
        "bad_no_get_inputs.py",
        "bad_no_model.py",
        "bad_syntax.py",
    ]
    assert len(report) == 4 and not report.ok


def test_load_task_folder_rejects_a_file():
    """A path that is not a folder raises."""
    with pytest.raises(TaskLoadError, match="not a directory"):
        load_task_folder(FOLDER / "good_relu.py")


def test_load_kernelbench_ids_levels_and_numeric_order():
    """KernelBench: ids kernelbench/levelN/stem, level from folder, 10 sorted after 2, errors kept."""
    report = load_kernelbench(KERNELBENCH)
    assert [t.id for t in report] == [
        "kernelbench/level1/1_Square_matrix_multiplication_",
        "kernelbench/level1/2_Standard_matrix_multiplication_",
        "kernelbench/level1/10_ReLU",
        "kernelbench/level2/1_Matmul_ReLU",
        "kernelbench/level3/3_Tiny_MLP",
    ]
    assert [t.level for t in report] == [1, 1, 1, 2, 3]
    reasons = {Path(e.path).name: e.reason for e in report.errors}
    assert set(reasons) == {"5_Broken_Syntax.py", "notes.py"}
    assert reasons["5_Broken_Syntax.py"].startswith("syntax error at line 7")
    assert "N_Name.py" in reasons["notes.py"]
    # the inner KernelBench/ folder works as root too, with the same ids
    assert [t.id for t in load_kernelbench(KERNELBENCH / "KernelBench")] == [t.id for t in report]


def test_load_kernelbench_levels_option():
    """level4 (Hugging Face models upstream) loads only on request; a requested missing level is an error."""
    assert [t.id for t in load_kernelbench(KERNELBENCH, levels=(4,))] == ["kernelbench/level4/1_Hub_Model"]
    report = load_kernelbench(KERNELBENCH, levels=(1, 7))
    assert len(report) == 3
    assert [(Path(e.path).name, e.reason) for e in report.errors] == [("level7", "level folder missing")]


def test_load_kernelbench_rejects_other_folders():
    """A folder without level1..3 is not a checkout."""
    with pytest.raises(TaskLoadError, match="level1"):
        load_kernelbench(FOLDER)


@pytest.mark.parametrize("name", ["ops_table.parquet", "ops_table.jsonl"])
def test_load_ops_table(name):
    """Ops table: ids data_source/rowK, tags from ops (list or JSON string), origin file#row=K, bad row."""
    path = FIXTURES / name
    report = load_ops_table(path)
    assert [t.id for t in report] == ["ops6k-fixture/row0", "ops6k-fixture/row1", "ops6k-fixture/row2"]
    assert report[2].tags == ("torch.matmul", "torch.tanh", "torch.sum")
    assert report[0].origin == f"{path}#row=0"
    assert "torch.relu(x)" in report[0].source
    assert [(e.path, e.reason) for e in report.errors] == [
        (f"{path}#row=3", "missing module-level function get_inputs")
    ]


@pytest.mark.parametrize(
    "name, column", [("ops_table_no_ops.jsonl", "ops"), ("ops_table_bad.parquet", "code")]
)
def test_ops_table_missing_column_is_named(name, column):
    """A table without a required column raises naming that column."""
    with pytest.raises(TaskLoadError, match=f"missing column\\(s\\) {column}"):
        load_ops_table(FIXTURES / name)


def test_ops_table_ops_as_comma_string_and_bad_json(tmp_path):
    """ops as 'a, b' becomes two tags; a non-JSON line is an error naming the line."""
    code = (FIXTURES / "task_folder" / "good_relu.py").read_text()
    good = tmp_path / "t.jsonl"
    good.write_text(
        json.dumps({"code": code, "ops": "torch.relu, torch.add", "data_source": "my src"}) + "\n"
    )
    task = load_ops_table(good)[0]
    assert (task.id, task.tags) == ("my_src/row0", ("torch.relu", "torch.add"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + "{oops\n")
    with pytest.raises(TaskLoadError, match="line 2 is not JSON"):
        load_ops_table(bad)
    with pytest.raises(TaskLoadError, match="expected a .parquet or .jsonl"):
        load_ops_table(tmp_path / "t.csv")


def test_ops_table_level_from_the_code_header(tmp_path):
    """A row's level is its code's ``# level: N`` header (a generated chain says 2), else 1; the
    ``level`` argument overrides both."""
    code = (FIXTURES / "task_folder" / "good_relu.py").read_text()
    rows = [{"code": "# level: 2\n" + code, "ops": [], "data_source": "gen"}, {"code": code, "ops": []}]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [t.level for t in load_ops_table(path)] == [2, 1]
    assert [t.level for t in load_ops_table(path, level=3)] == [3, 3]


def test_load_tasks_dispatches_on_the_path():
    """load_tasks picks the loader from what the path is."""
    assert [t.id for t in load_tasks(FOLDER / "good_relu.py")] == ["good_relu"]
    assert load_tasks(FOLDER / "bad_syntax.py").errors[0].reason.startswith("syntax error")
    assert len(load_tasks(KERNELBENCH)) == 5
    assert len(load_tasks(FOLDER)) == 4
    assert len(load_tasks(FIXTURES / "ops_table.jsonl")) == 3
    with pytest.raises(TaskLoadError, match="no such file"):
        load_tasks(FIXTURES / "does_not_exist")


def test_duplicate_ids_are_error_entries():
    """A second task with the same id is reported, the first is kept."""
    report = LoadReport()
    report.add(Task.from_source("a", "x = 1", origin="one.py"))
    report.add(Task.from_source("a", "x = 2", origin="two.py"))
    assert [t.source for t in report] == ["x = 1"]
    assert report.errors == [TaskLoadError("two.py", "duplicate task id 'a'")]


def test_read_header_stops_at_code():
    """Only the leading comment block is read."""
    assert read_header("# tags: a,b\n\n# level: 2\nimport x\n# level: 3\n") == (2, ("a", "b"))
    assert read_header("import x\n# level: 2\n") == (None, ())


def test_task_load_error_pickles():
    """Errors cross process boundaries (Ray) intact."""
    error = TaskLoadError("p.py", "why")
    assert pickle.loads(pickle.dumps(error)) == error
