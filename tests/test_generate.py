"""The Ops-6K-style task generator (autoprofiler/generate, datasets/ops_gen): the catalog, composition
into KernelBench-form code the loader reads, de-duplication, the CPU check in worker processes (and
the reasons it records for broken ops), same seed -> same table, sizing by memory, and the GPU filter
script's CPU path (verdict log, summary, resume)."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import load_script

from autoprofiler.generate import catalog as catalog_module
from autoprofiler.generate import checks, compose, dataset, sizing
from autoprofiler.generate.catalog import CATALOG, make_catalog
from autoprofiler.generate.checks import check_on_cpu
from autoprofiler.generate.compose import GenerateConfig, generate_task
from autoprofiler.generate.dataset import Dataset, build_dataset, dedupe, write_tables
from autoprofiler.generate.spec import Built, Op
from autoprofiler.tasks import check_source, load_ops_table

ROOT = Path(__file__).resolve().parents[1]
MAKE = ROOT / "datasets" / "ops_gen" / "make.py"
FILTER = ROOT / "datasets" / "ops_gen" / "filter_gpu.py"
REQUIRED_FAMILIES = {
    "matmul",
    "conv",
    "norm",
    "activation",
    "reduction",
    "softmax",
    "pooling",
    "elementwise",
    "attention",
    "embedding",
    "scan",
    "indexing",
}


# -- broken ops: each fails the CPU check in one known way ------------------------------------------------
def _op(name: str, forward: tuple[str, ...], out=lambda x: x) -> Op:
    return Op(
        name, "elementwise", ("mat",), lambda x, ctx: Built(apis=("test",), out=out(x), forward=forward)
    )


def _double_full(x):
    return x.replace_axis(1, x.small[1], 2 * x.full[1], None)


BROKEN = {
    "lying_shape": (_op("lying_shape", ("x = torch.cat([x, x], dim=-1)",)), "shape_mismatch"),
    "lying_full_shape": (
        _op("lying_full_shape", ("x = torch.relu(x)",), _double_full),
        "full_shape_mismatch",
    ),
    "unseeded": (_op("unseeded", ("torch.seed()", "x = x + torch.rand_like(x)")), "nondeterministic"),
    "raises": (_op("raises", ("raise RuntimeError('broken on purpose')",)), "run_error"),
    "constant": (_op("constant", ("x = torch.zeros_like(x)",)), "constant_output"),
    "crashes": (_op("crashes", ("__import__('os')._exit(3)",)), "crashed"),
    "hangs": (_op("hangs", ("while True: pass",)), "timeout"),
}
SINGLE = GenerateConfig(op_count_weights=(1.0,))


def _only(name: str, seed: int = 0):
    """A one-op task of the broken op ``name``."""
    return generate_task(seed, {name: BROKEN[name][0]}, SINGLE)


def test_catalog_has_40_ops_over_the_required_families():
    """>= 40 ops; every family the issue names is present; the named ops are there; names are unique."""
    assert len(CATALOG) >= 40
    assert REQUIRED_FAMILIES <= {op.family for op in CATALOG.values()}
    for name in (
        "linear",
        "matmul",
        "bmm_gram",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "layer_norm",
        "softmax",
        "logsumexp",
        "sdpa",
        "embedding",
        "cumsum",
        "gather",
        "max_pool",
    ):
        assert name in CATALOG, name
    with pytest.raises(ValueError, match="'relu' is in the catalog twice"):
        make_catalog((CATALOG["relu"],), (CATALOG["relu"],))


def test_every_op_is_used_and_tasks_are_kernelbench_form():
    """1,500 seeds use every op of the catalog; every task parses as KernelBench form, names its dtype,
    has 1-5 ops and data_source torch#k, and reads its sizes from AUTOPROFILER_TASK_SIZE."""
    tasks = [generate_task(seed) for seed in range(1500)]
    used = {name for task in tasks for name in task.ops}
    assert used == set(CATALOG), set(CATALOG) - used
    assert {task.dtype for task in tasks} == {"fp32", "fp16", "bf16"}
    for task in tasks[:200]:
        check_source(task.code)
        assert 1 <= len(task.ops) <= 5 and task.data_source == f"torch#{len(task.ops)}"
        assert 'SMALL = os.environ.get("AUTOPROFILER_TASK_SIZE", "full") == "small"' in task.code
        assert f"DTYPE = {compose.TORCH_DTYPES[task.dtype]}" in task.code
        assert task.small_shape[0] == 2 and task.full_shape[0] == task.full_batch >= 2


def test_same_seed_same_task_and_seeds_differ():
    """generate_task is a function of the seed: equal sources for equal seeds, different for others."""
    assert [generate_task(s).code for s in range(30)] == [generate_task(s).code for s in range(30)]
    assert len({generate_task(s).hash for s in range(30)}) == 30


def test_table_loads_with_the_existing_loader(tmp_path):
    """write_tables -> load_ops_table: every row loads, ids torch#k/rowN, tags are the ops column."""
    tasks = [generate_task(s) for s in range(12)]
    write_tables(Dataset(tasks=tasks, candidates=list(range(12))), tmp_path)
    report = load_ops_table(tmp_path / "tasks.parquet")
    assert report.errors == [] and len(report) == 12
    for row, (task, loaded) in enumerate(zip(tasks, report, strict=True)):
        assert loaded.id == f"torch#{len(task.ops)}/row{row}"
        assert loaded.source == task.code and loaded.hash == task.hash
        assert loaded.tags == task.apis
    columns = pq.read_table(tmp_path / "tasks.parquet").column_names
    assert columns[:3] == ["code", "ops", "data_source"] and set(dataset.TASK_COLUMNS) == set(columns)


def test_dedupe_keeps_the_first_of_each_hash():
    """Two candidates with the same code: the first is kept, the second rejected naming the first; a
    hash seen in an earlier batch is rejected too."""
    a, b = generate_task(1), generate_task(2)
    seen: dict[str, int] = {}
    kept, dropped = dedupe([(0, a), (1, b), (2, replace(a, seed=99))], seen)
    assert [k for k, _ in kept] == [0, 1]
    assert [(r.candidate, r.stage, r.reason) for r in dropped] == [
        (2, "duplicate", "same content hash as candidate 0")
    ]
    kept, dropped = dedupe([(3, b)], seen)
    assert kept == [] and dropped[0].reason == "same content hash as candidate 1"


def test_memory_sizing_gives_the_same_chain_at_a_chosen_peak():
    """peak_gib=35 (1/4 of an H200), tensors allowed past 2**31 elements: the same ops and dtype as the
    default sizing of each seed, a larger batch, an estimated peak within 35 GiB and at least 34 GiB.
    The default sizing keeps the estimated peak within its 8 GiB cap."""
    config = GenerateConfig(peak_gib=35, max_tensor_elems=2**34)
    for seed in range(20):
        default, big = generate_task(seed), generate_task(seed, config=config)
        assert big.ops == default.ops and big.dtype == default.dtype and big.size_class == "peak35GiB"
        assert big.full_batch > default.full_batch and 34.0 <= big.est_full_peak_gib <= 35.0, big
    assert max(generate_task(s).est_full_peak_gib for s in range(300)) <= 8.0


def test_config_errors_name_the_field():
    """A bad GenerateConfig is one ValueError naming every problem."""
    with pytest.raises(ValueError, match=r"target_ms must be 0 < low <= high.*peak_gib must be > 0"):
        GenerateConfig(target_ms=(5.0, 1.0), peak_gib=-1.0)


@pytest.mark.parametrize("module", [catalog_module, sizing, compose, checks, dataset])
def test_docstring_examples(module):
    """The examples in the module docstrings run as written."""
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0


@pytest.fixture(scope="module")
def cpu_checked():
    """One pool run: 16 generated tasks and one task of each broken op (3 s limit for the hang only)."""
    good = [generate_task(seed) for seed in range(16)]
    broken = {name: _only(name) for name in BROKEN}
    timeouts = [None] * len(good) + [3.0 if name == "hangs" else None for name in broken]
    results = check_on_cpu(good + list(broken.values()), workers=2, timeout_s=120.0, timeouts=timeouts)
    return good, dict(zip(broken, results[len(good) :], strict=True)), results[: len(good)]


def test_generated_tasks_pass_the_cpu_check_in_subprocesses(cpu_checked):
    """Generated tasks pass (a few seeds compose degenerate chains; those must say why), with a
    measured small-size forward time."""
    good, _, results = cpu_checked
    passed = [r for r in results if r.ok]
    assert len(passed) >= 13, [
        (t.ops, r.kind, r.reason) for t, r in zip(good, results, strict=True) if not r.ok
    ]
    assert all(r.data["small_ms"] > 0 for r in passed)
    assert all(r.kind in {"constant_output", "ignores_inputs", "nonfinite"} for r in results if not r.ok)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_op_is_rejected_with_its_reason(cpu_checked, name):
    """Each broken op fails with the reason kind it was written for, and a reason text."""
    _, broken, _ = cpu_checked
    result = broken[name]
    assert not result.ok and result.kind == BROKEN[name][1], (result.kind, result.reason)
    assert result.reason


def test_the_driver_never_runs_task_code(monkeypatch):
    """Generating and checking do not execute task code here: a task whose import would crash this
    process (os._exit at module level) is only ever run by a worker."""
    task = _only("constant")
    poisoned = replace(task, code=task.code.replace("import os\n", "import os\nos._exit(7)\n", 1))
    [result] = check_on_cpu([poisoned], workers=1, timeout_s=30.0)
    assert result.kind == "crashed" and "exit code 7" in result.reason


def test_rejections_are_recorded_and_the_same_seed_gives_the_same_table(tmp_path):
    """make.py (a real run, 6 tasks from a catalog with a broken op mixed in) writes tasks, rejected and
    stats; its tables equal an in-process build_dataset with the same seed; rejected rows name the stage
    and reason of the broken op."""
    small_catalog = {name: CATALOG[name] for name in ("relu", "tanh", "linear", "softmax", "sum")}
    small_catalog["lying_shape"] = BROKEN["lying_shape"][0]
    data = build_dataset(6, seed=3, catalog=small_catalog, workers=2)
    write_tables(data, tmp_path / "a")
    rejected = pq.read_table(tmp_path / "a" / "rejected.parquet").to_pylist()
    assert any(
        r["stage"] == "cpu_check" and r["kind"] == "shape_mismatch" and "lying_shape" in r["op_names"]
        for r in rejected
    ), rejected
    assert all(r["candidate"] <= data.candidates[-1] for r in rejected)
    again = build_dataset(6, seed=3, catalog=small_catalog, workers=1)
    write_tables(again, tmp_path / "b")
    for name in ("tasks.parquet", "rejected.parquet"):
        assert pq.read_table(tmp_path / "a" / name).equals(pq.read_table(tmp_path / "b" / name)), name


def test_make_script_and_gpu_filter_on_cpu(tmp_path):
    """make.py --count 4 writes a table the loader reads; filter_gpu.py --device cpu times 2 tasks,
    compiles 1 (backend eager), logs verdicts, writes the summary, and a rerun has nothing left to do."""
    out = tmp_path / "gen"
    run = subprocess.run(
        [sys.executable, str(MAKE), "--count", "4", "--seed", "5", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "load_ops_table: 4 tasks, 0 errors" in run.stdout
    stats = json.loads((out / "stats.json").read_text())
    assert stats["tasks"] == 4 and stats["load_errors"] == 0 and sum(stats["coverage"].values()) > 0
    table, log = out / "tasks.parquet", tmp_path / "v.jsonl"
    common = ["--table", str(table), "--device", "cpu", "--verdicts", str(log)]
    for stage in (["--stage", "time", "--limit", "2"], ["--stage", "compile", "--all", "--limit", "1"]):
        run = subprocess.run(
            [sys.executable, str(FILTER), *stage, *common], capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, run.stderr + run.stdout
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["stage"] for r in rows] == ["time", "time", "compile"]
    assert all(r["kind"] in ("", "eager_time") for r in rows if r["stage"] == "time")  # CPU small: < 1 ms
    assert all(r["gpu"] == "" for r in rows if r["stage"] == "time")  # the card that timed it; none here
    assert rows[-1]["ok"] and rows[-1]["max_abs_diff"] == 0.0  # backend eager gives eager's output
    summary = pq.read_table(tmp_path / "v.parquet").to_pylist()
    assert len(summary) == 4 and sum(r["time_ok"] is not None for r in summary) == 2
    run = subprocess.run(
        [sys.executable, str(FILTER), "--stage", "time", "--limit", "2", *common],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "time: 2 tasks to run of 4 (3 verdicts" in run.stdout  # the two not timed yet


def test_make_script_rejects_bad_arguments_in_one_line():
    """--count 0: exit 2 and one line naming the flag, before any work."""
    run = subprocess.run(
        [sys.executable, str(MAKE), "--count", "0"], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 2 and "--count must be >= 1, got 0" in run.stderr
    assert "Traceback" not in run.stderr


def test_committed_table_matches_the_generator():
    """datasets/ops_gen/tasks.parquet: 6,000 rows, unique hashes, torch#k matching the chain length,
    and rows regenerate from their seed byte for byte (a catalog change needs the table regenerated:
    python datasets/ops_gen/make.py --count 6000 --seed 0)."""
    rows = pq.read_table(ROOT / "datasets" / "ops_gen" / "tasks.parquet").to_pylist()
    assert len(rows) == 6000 and len({row["hash"] for row in rows}) == 6000
    assert all(row["data_source"] == f"torch#{len(row['op_names'])}" for row in rows)
    for row in rows[:: len(rows) // 25]:
        task = generate_task(row["seed"])
        assert (task.code, task.hash, list(task.ops)) == (row["code"], row["hash"], row["op_names"])


def _select_module():
    return load_script(ROOT / "bench" / "select_generated.py")


def test_selection_grows_by_appending_and_the_second_pool_comes_after_the_first():
    """Past the 3 GiB pool the rule continues with the 6 GiB bound; a larger count never reorders the
    tasks a smaller one chose, and no task above either bound's time or memory is taken."""
    select = _select_module().select
    rows = [
        {"hash": f"{i:04x}", "data_source": f"torch#{i % 3 + 1}", "est_full_ms": (1.0, 5.0)[i % 7 == 0],
         "est_full_peak_gib": (1.0, 4.0, 8.0)[i % 5 % 3]}
        for i in range(120)
    ]
    small = [r["hash"] for r in select(rows, 20)]
    every = select(rows, 1000)
    assert [r["hash"] for r in every][:20] == small
    gib = [r["est_full_peak_gib"] for r in every]
    first_big = gib.index(4.0)
    assert set(gib[:first_big]) == {1.0} and set(gib[first_big:]) == {4.0}
    assert all(r["est_full_ms"] <= 4.0 for r in every) and len({r["hash"] for r in every}) == len(every)
    assert len(every) == sum(1 for r in rows if r["est_full_ms"] <= 4.0 and r["est_full_peak_gib"] <= 6.0)


def test_the_committed_selection_is_the_rule_applied_to_the_committed_tasks():
    module = _select_module()
    from autoprofiler.tasks import ops_task_id

    columns = ["data_source", "hash", "est_full_ms", "est_full_peak_gib"]
    rows = pq.read_table(module.TABLE, columns=columns).to_pylist()
    for index, r in enumerate(rows):
        r["id"] = ops_task_id(r["data_source"], index, module.TABLE)
    committed = [ln.split("\t") for ln in (module.OUT / "selection.txt").read_text().splitlines()
                 if ln and not ln.startswith("#")]
    assert [[r["id"], r["hash"]] for r in module.select(rows, len(committed))] == committed
