"""ncu: parsing real H200 captures, the command line, error classes at a real subprocess boundary, and
the whole Profiler->ncu->program->report path with a stand-in ``ncu`` executable on PATH."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from autoprofiler.profiling import ncu
from autoprofiler.profiling.cache import ProfileCache
from autoprofiler.profiling.groups import ncu_request_metrics
from autoprofiler.profiling.ncu import (
    CountersNotPermitted,
    NcuNotFound,
    NoKernelsProfiled,
    ProgramFailed,
    build_ncu_command,
    kernel_passes,
    parse_ncu_csv,
    parse_value,
    range_names,
    split_by_task,
)
from autoprofiler.profiling.profile import profile_from_kernels
from autoprofiler.profiling.profiler import Profiler
from autoprofiler.tasks import Task

FIXTURES = Path(__file__).parent / "fixtures" / "ncu"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


# --- parsing ---------------------------------------------------------------------------------------
def test_parse_three_metrics_with_interleaved_prof_lines():
    """==PROF== lines and the program's 'ok' before the CSV are skipped; 9 kernels, base units."""
    table = parse_ncu_csv(read("torch_mix_three_metrics.csv"))
    assert len(table.rows) == 9
    first = table.rows[0]
    assert first["Kernel Name"].startswith("sm80_xmma_gemm_f32f32")
    assert first["gpu__time_duration.sum"] == 2683360.0
    assert first["sm__throughput.avg.pct_of_peak_sustained_elapsed"] == 86.81
    assert table.rows[1]["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == 73.04
    assert table.units["gpu__time_duration.sum"] == "ns"
    assert table.units["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == "%"
    assert [r["ID"] for r in table.rows] == [float(i) for i in range(9)]
    assert kernel_passes(table.rows) == 9
    assert range_names(first, table.nvtx_columns) == ["target"]


def test_parse_speed_of_light_capture():
    """The SpeedOfLight section capture: 10 passes, SOL columns present."""
    table = parse_ncu_csv(read("torch_mix_speedoflight.csv"))
    assert len(table.rows) == 9 and kernel_passes(table.rows) == 10
    assert table.rows[0]["dram__cycles_elapsed.avg.per_second"] == 3199455108.80
    assert table.rows[0]["gpc__cycles_elapsed.max"] == 5330199.0


def test_parse_full_set_with_thousands_separators():
    """--set full capture: 2240 columns, numbers like "1,972,391,611.57", empty cells are None."""
    table = parse_ncu_csv(read("torch_mix_full_autounits.csv"))
    assert len(table.columns) == 2240 and len(table.rows) == 9
    row = table.rows[0]
    assert row["l1tex__cycles_elapsed.avg.per_second"] == 1972391611.57
    assert row["dram__bytes_read.sum"] == 341967360.0
    assert row["gpu__time_duration.sum"] == 2686656.0
    assert row["LTS.TriageCompute.lts__throughput.avg.pct_of_peak_sustained_elapsed"] is None
    assert row["launch__cluster_scheduling_policy"] == "PolicySpread"
    assert row["Block Size"] == "(256, 1, 1)"
    assert kernel_passes(table.rows) == 38


def test_parse_tiny_full_set_base_units():
    """One kernel, base units, nan -> None, and the stall ratios of the stalls group are there."""
    table = parse_ncu_csv(read("tiny_kernel_full_set_baseunits.csv"))
    (row,) = table.rows
    assert row["Kernel Name"] == "k(float *, int)"
    assert row["gpu__time_duration.sum"] == 47360.0
    assert row["derived_tempMetric4"] is None
    assert row["smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"] == 50.28
    assert table.nvtx_columns == []


def test_parse_linear_gelu_nvtx_and_split_by_range():
    """bf16 Linear+GELU in range 'fwd': the GEMM uses gmma, the GELU kernel only trips the hmma pipe."""
    table = parse_ncu_csv(read("torch_linear_gelu_tensor_metrics_nvtx.csv"))
    gemm, gelu = table.rows
    assert range_names(gemm, table.nvtx_columns) == ["fwd"]
    assert gemm["sm__inst_executed_pipe_tensor_op_gmma.sum"] == 2097152.0
    assert gelu["sm__inst_executed_pipe_tensor_op_gmma.sum"] == 0.0
    assert gelu["sm__inst_executed_pipe_tensor_op_hmma.sum"] == 131072.0  # the trap
    assert split_by_task(table, ["only"]) == {"only": [gemm, gelu]}


def test_parse_compact_and_range_replay_captures():
    """Other real layouts: compact 42-metric set (17 passes) and range replay ('range' row, n/a stream)."""
    compact = parse_ncu_csv(read("torch_linear_gelu_compact42.csv"))
    assert len(compact.rows) == 2 and kernel_passes(compact.rows) == 17
    assert compact.rows[0]["dram__bytes_read.sum"] == 148704768.0
    ranged = parse_ncu_csv(read("torch_linear_gelu_range_replay.csv"))
    assert ranged.rows[0]["Kernel Name"] == "range" and ranged.rows[0]["Stream"] is None


def test_parse_value_and_unit_scaling():
    """Cells: separators, missing markers, text; auto-scaled units are converted to base units."""
    assert parse_value("2,683,360") == 2683360.0
    assert parse_value("-1.5e3") == -1500.0
    assert parse_value("n/a") is None and parse_value("") is None
    assert parse_value("(16, 32, 1)") == "(16, 32, 1)"
    text = '"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","x.avg.per_second"\n'
    text += '"","","us","Mbyte","Ghz"\n"0","k","2.5","1,024","1.98"\n'
    (row,) = parse_ncu_csv(text).rows
    assert row["gpu__time_duration.sum"] == 2500.0
    assert row["dram__bytes_read.sum"] == 1024e6
    assert row["x.avg.per_second"] == pytest.approx(1.98e9)


def test_parse_without_kernels_raises():
    """No header (nothing profiled) and a header without rows are both NoKernelsProfiled."""
    with pytest.raises(NoKernelsProfiled):
        parse_ncu_csv("==PROF== Disconnected from process 1\n")
    with pytest.raises(NoKernelsProfiled):
        parse_ncu_csv('"ID","Kernel Name"\n"",""\n')


DOMAIN, NONE6 = "<default domain>", ":".join(["none"] * 6)


def test_split_by_task_in_batch_mode():
    """Rows are assigned to tasks by the ap:<id> range in their NVTX stack, in ID order."""
    table = parse_ncu_csv(read("torch_mix_three_metrics.csv"))
    column = table.nvtx_columns[0]
    for i, row in enumerate(table.rows):
        task = "aaaa" if i < 4 else "bbbb"
        row[column] = f'1  "{DOMAIN}:autoprofiler:{NONE6}" "{DOMAIN}:ap:{task}:{NONE6}"'
    table.rows.reverse()
    split = split_by_task(table, ["aaaa", "bbbb"])
    assert [r["ID"] for r in split["aaaa"]] == [0.0, 1.0, 2.0, 3.0]
    assert [r["ID"] for r in split["bbbb"]] == [4.0, 5.0, 6.0, 7.0, 8.0]
    assert range_names(table.rows[0], [column]) == ["autoprofiler", "ap:bbbb"]


def test_profile_from_real_capture_aggregates_and_derives():
    """The three-metric capture becomes a root-group profile with duration-weighted throughputs."""
    table = parse_ncu_csv(read("torch_mix_three_metrics.csv"))
    profile = profile_from_kernels(
        "t", table.rows, ["root"], table.units, wall_us=4000.0, passes=9, seconds=1.0, device="H200"
    )
    durations = [r["gpu__time_duration.sum"] for r in table.rows]
    sm = [r["sm__throughput.avg.pct_of_peak_sustained_elapsed"] for r in table.rows]
    assert profile.metrics["gpu__time_duration.sum"] == sum(durations) == 2942432.0
    assert profile.metrics["sm__throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx(
        sum(d * s for d, s in zip(durations, sm, strict=True)) / sum(durations)
    )
    assert profile.metrics["derived__kernel_count"] == 9.0
    assert "derived__launch_overhead_share" not in profile.metrics  # not a root-group feature
    assert profile.units["sm__throughput.avg.pct_of_peak_sustained_elapsed"] == "%"
    assert set(profile.kernels[0]) == {
        "name",
        "id",
        "gpu__time_duration.sum",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    }


def test_tensor_core_share_ignores_hmma_trap():
    """Only the gmma GEMM counts as tensor-core time on the Linear+GELU capture."""
    table = parse_ncu_csv(read("torch_linear_gelu_tensor_metrics_nvtx.csv"))
    profile = profile_from_kernels(
        "t", table.rows, ["tensor_cores"], table.units, wall_us=None, passes=11, seconds=1.0, device="H200"
    )
    assert profile.metrics["derived__tensor_core_time_share"] == pytest.approx(176032 / (176032 + 23520))
    assert profile.metrics["derived__tensor_flop_count"] == 137438953472.0  # 2 * 4096^3 bf16 GEMM


H200_CAPTURES = sorted((FIXTURES / "h200").glob("*.csv")) if (FIXTURES / "h200").is_dir() else []


@pytest.mark.skipif(
    not H200_CAPTURES, reason="no captures in tests/fixtures/ncu/h200 yet (written by the GPU tests)"
)
@pytest.mark.parametrize("path", H200_CAPTURES, ids=[p.name for p in H200_CAPTURES])
def test_parse_committed_h200_captures(path):
    """Every capture the GPU tests wrote parses: kernel rows with durations and replay passes."""
    table = parse_ncu_csv(path.read_text())
    assert table.rows and kernel_passes(table.rows) > 0
    for row in table.rows:
        assert isinstance(row["gpu__time_duration.sum"], float) and row["gpu__time_duration.sum"] > 0
        assert row["Kernel Name"]


# --- command line ----------------------------------------------------------------------------------
def test_ncu_command_line():
    """Profiling command: NVTX filter, metrics, unlocked clocks, all processes, report, force, program."""
    cmd = build_ncu_command(
        "/opt/ncu", Path("/w/report"), ["a.sum", "b.ratio"], ["python", "-m", "prog", "job.json"]
    )
    assert cmd == [
        "/opt/ncu", "--nvtx", "--nvtx-include", "autoprofiler/", "--metrics", "a.sum,b.ratio",
        "--clock-control", "none", "--target-processes", "all", "-o", "/w/report", "-f",
        "python", "-m", "prog", "job.json",
    ]  # fmt: skip
    per_task = build_ncu_command("ncu", Path("r"), ["a.sum"], ["p"], nvtx_includes=("ap:1", "ap:2"))
    assert per_task[:6] == ["ncu", "--nvtx", "--nvtx-include", "ap:1/", "--nvtx-include", "ap:2/"]
    full = build_ncu_command("ncu", Path("r"), None, ["p"], extra_args=("--set", "full"))
    assert "--metrics" not in full and full[4:6] == ["--set", "full"]
    assert ncu.build_export_command("ncu", Path("r.ncu-rep")) == [
        "ncu", "-i", "r.ncu-rep", "--csv", "--page", "raw", "--print-units", "base",
    ]  # fmt: skip


# --- a stand-in ncu on PATH ------------------------------------------------------------------------
FAKE_NCU = textwrap.dedent(
    r'''
    #!PYTHON
    """Stand-in for Nsight Compute: FAKE_NCU_MODE = ok | perm | crash | hang | nokernels."""
    import csv, io, json, os, subprocess, sys, time
    args = sys.argv[1:]
    mode = os.environ.get("FAKE_NCU_MODE", "ok")
    log = os.environ.get("FAKE_NCU_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps(args) + "\n")
    if "--version" in args:
        print("NVIDIA (R) Nsight Compute Command Line Profiler")
        print("Version 2025.3.1.0 (build 1) (public-release)")
        sys.exit(0)
    if mode == "perm":
        print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
              "Performance Counters on the target device 0.")
        sys.exit(1)
    if mode == "hang":
        time.sleep(60)
    refused = [m for m in os.environ.get("FAKE_NCU_RANGE_REFUSE", "").split(",") if m]
    if "--replay-mode" in args and "--metrics" in args:  # as ncu 2025.3 does: one error line per metric
        asked = args[args.index("--metrics") + 1].split(",")
        named = [m for m in refused if m in asked]
        if named:
            for m in named:
                print("==ERROR== Metric %s is not supported in range replay" % m)
            sys.exit(1)
    if "-i" in args:  # export: the real capture, rows dealt to the job's tasks by NVTX range
        state = json.load(open(args[args.index("-i") + 1]))
        lines = [l for l in open(state["fixture"]).read().splitlines() if l.startswith('"')]
        rows = list(csv.reader(lines))
        header, units, body = rows[0], rows[1], rows[2:]
        col = [i for i, c in enumerate(header) if "Push/Pop_Range" in c][0]
        out = io.StringIO()
        w = csv.writer(out, quoting=csv.QUOTE_ALL, lineterminator="\n")
        w.writerow(header)
        w.writerow(units)
        ids = [t["id"] for t in state["job"]["tasks"]]
        no_stack = os.environ.get("FAKE_NCU_NVTX") == "none"  # an export that prints no NVTX stack
        for i, row in enumerate(body):
            task = ids[0] if i < 3 or len(ids) == 1 else ids[1 + (i % (len(ids) - 1))]
            ranges = ("autoprofiler", "ap:" + task)
            stack = ['"<default domain>:%s:none:none:none:none:none:none"' % r for r in ranges]
            row[col] = "" if no_stack else "7  " + " ".join(stack)
            if "--print-nvtx-rename" in args:
                row[header.index("Kernel Name")] = "ap:" + task
            w.writerow(row)
        sys.stdout.write(out.getvalue())
        sys.exit(0)
    report = args[args.index("-o") + 1] + ".ncu-rep"
    program = args[args.index("-f") + 1:]
    job_path = program[-1]
    job = json.load(open(job_path))
    job["device"] = "cpu"  # no GPU here: the program runs its real path on the CPU
    json.dump(job, open(job_path, "w"))
    print("==PROF== Connected to process 1 (%s)" % sys.executable)
    if mode == "crash":
        program = [sys.executable, "-c", "import sys; print('Traceback: boom', file=sys.stderr); sys.exit(1)"]
    if mode == "nokernels":  # (the real ncu would run the program first; not needed to test detection)
        print("==PROF== Disconnected from process 1\n==WARNING== No kernels were profiled.")
        sys.exit(0)
    done = subprocess.run(program)
    if done.returncode != 0:
        print("==ERROR== The application returned an error code (%d)." % done.returncode)
        sys.exit(done.returncode)
    fixture = os.environ["FAKE_NCU_FIXTURE"]
    if "--replay-mode" in args and args[args.index("--replay-mode") + 1] == "range":
        fixture = os.environ.get("FAKE_NCU_RANGE_FIXTURE", fixture)
    json.dump({"job": job, "fixture": fixture}, open(report, "w"))
    print("==PROF== Disconnected from process 1")
    '''
).lstrip()


@pytest.fixture
def fake_ncu(tmp_path, monkeypatch):
    """A directory on PATH holding an executable ``ncu`` stand-in; returns its log path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "ncu"
    script.write_text(FAKE_NCU.replace("#!PYTHON", f"#!{sys.executable}"))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "ncu_calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NCU_LOG", str(log))
    monkeypatch.setenv("FAKE_NCU_FIXTURE", str(FIXTURES / "torch_mix_three_metrics.csv"))
    return log


TINY = textwrap.dedent(
    """
    import torch
    class Model(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.n = n
        def forward(self, x):
            return torch.relu(x) * self.n
    def get_inputs():
        return [torch.randn(8, 8)]
    def get_init_inputs():
        return [2]
    """
)


def tiny_task(name: str = "relu") -> Task:
    return Task.from_source(f"tests/{name}", TINY + f"\n# {name}\n")


def test_missing_ncu_raises_ncu_not_found(tmp_path):
    """No ncu at the given path: NcuNotFound before anything runs, naming the path."""
    profiler = Profiler(source="ncu", device="cuda", ncu_path=str(tmp_path / "no" / "ncu"))
    with pytest.raises(NcuNotFound, match="not found"):
        profiler.collect(tiny_task(), ["root"])


def test_counter_permission_error(fake_ncu, monkeypatch):
    """ERR_NVGPUCTRPERM in ncu's output becomes CountersNotPermitted with the fix; nothing cached."""
    monkeypatch.setenv("FAKE_NCU_MODE", "perm")
    profiler = Profiler(source="ncu", device="cuda")
    with pytest.raises(CountersNotPermitted, match="NVreg_RestrictProfilingToAdminUsers=0") as info:
        profiler.collect(tiny_task(), ["root"])
    assert "run as root" in str(info.value)
    assert info.value.failures == {tiny_task().hash: str(info.value).splitlines()[0]}


def test_program_crash_and_timeout(fake_ncu, monkeypatch, tmp_path):
    """A non-zero exit is ProgramFailed with the output tail; a hang is killed at the timeout."""
    cache = ProfileCache(tmp_path / "cache")
    monkeypatch.setenv("FAKE_NCU_MODE", "crash")
    profiler = Profiler(source="ncu", device="cuda", cache=cache)
    with pytest.raises(ProgramFailed, match="boom"):
        profiler.collect(tiny_task(), ["root"])
    monkeypatch.setenv("FAKE_NCU_MODE", "hang")
    with pytest.raises(ProgramFailed, match="timed out after 2 s"):
        Profiler(source="ncu", device="cuda", cache=cache, timeout_s=2).collect(tiny_task(), ["root"])
    assert len(ProfileCache(tmp_path / "cache")) == 0


def test_nvtx_range_without_kernels(fake_ncu, monkeypatch):
    """ncu reporting no kernel in the range is NoKernelsProfiled."""
    monkeypatch.setenv("FAKE_NCU_MODE", "nokernels")
    with pytest.raises(NoKernelsProfiled):
        Profiler(source="ncu", device="cuda", task_size="small").collect(tiny_task(), ["root"])


def test_batch_through_stand_in_ncu(fake_ncu, tmp_path):
    """Profiler -> ncu command -> _program (really run) -> export -> split by ap:<hash> -> cache."""
    tasks = [tiny_task("a"), tiny_task("b")]
    cache = ProfileCache(tmp_path / "cache")
    profiler = Profiler(
        source="ncu", device="cuda", cache=cache, task_size="small", capture_dir=tmp_path / "captures"
    )
    first, second = profiler.collect_many(tasks, ["root", "occupancy"])
    calls = [json.loads(line) for line in fake_ncu.read_text().splitlines()]
    profile_call = next(c for c in calls if "-o" in c)
    assert profile_call[:4] == ["--nvtx", "--nvtx-include", "autoprofiler/", "--metrics"]
    assert profile_call[4].split(",") == [
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "gpu__time_duration.sum",
        "sm__warps_active.avg.pct_of_peak_sustained_active",
    ]
    assert profile_call[profile_call.index("--clock-control") + 1] == "none"
    # The stand-in deals the capture's first 3 kernels to task a and the other 6 to task b.
    assert first.metrics["derived__kernel_count"] == 3 and second.metrics["derived__kernel_count"] == 6
    assert first.metrics["gpu__time_duration.sum"] == 2683360.0 + 31232.0 + 31392.0
    assert first.kernels[0]["launch__grid_size"] == 512.0
    assert first.passes == 9 and first.groups == {"root", "occupancy"}
    assert len(list((tmp_path / "captures").glob("*.csv"))) == 1
    assert len(profiler.runs) == 1 and profiler.runs[0].task_hashes == (tasks[0].hash, tasks[1].hash)
    assert profiler.environment.tool == "ncu 2025.3.1.0"
    # A second profiler on the same cache spawns nothing and reports zero cost.
    again = Profiler(source="ncu", device="cuda", cache=ProfileCache(tmp_path / "cache"), task_size="small")
    calls_before = len(fake_ncu.read_text().splitlines())
    cached = again.collect(tasks[0], ["root"])
    assert again.runs == [] and cached.passes == 0 and cached.seconds == 0.0
    assert cached.metrics["gpu__time_duration.sum"] == first.metrics["gpu__time_duration.sum"]
    assert len(fake_ncu.read_text().splitlines()) == calls_before + 1  # only `ncu --version`


def test_batch_without_nvtx_stack_uses_renamed_kernels(fake_ncu, monkeypatch):
    """An export with no NVTX stack: a second export with --print-nvtx-rename kernel maps rows to tasks."""
    monkeypatch.setenv("FAKE_NCU_NVTX", "none")
    tasks = [tiny_task("c"), tiny_task("d")]
    first, second = Profiler(source="ncu", device="cuda", task_size="small").collect_many(tasks, ["root"])
    assert first.metrics["derived__kernel_count"] == 3 and second.metrics["derived__kernel_count"] == 6
    assert first.kernels[0]["name"].startswith("sm80_xmma_gemm")  # the real names are kept
    exports = [c for c in map(json.loads, fake_ncu.read_text().splitlines()) if "-i" in c]
    assert [("--print-nvtx-rename" in e) for e in exports] == [False, True]


def test_range_replay_for_tasks_with_many_kernels(fake_ncu, monkeypatch):
    """range_replay_above: the root first (kernel replay: the kernel count), then the other groups with
    --replay-mode range from the real range-replay capture; kernel table and count stay the root's."""
    monkeypatch.setenv("FAKE_NCU_RANGE_FIXTURE", str(FIXTURES / "torch_linear_gelu_range_replay.csv"))
    task = tiny_task("loop")
    profiler = Profiler(source="ncu", device="cuda", task_size="small", range_replay_above=2)
    profile = profiler.collect(task, ["root", "occupancy"])
    calls = [json.loads(line) for line in fake_ncu.read_text().splitlines()]
    runs = [c for c in calls if "-o" in c]
    assert (
        len(runs) == 2
        and "--replay-mode" not in runs[0]
        and runs[1][runs[1].index("--replay-mode") + 1] == "range"
    )
    assert runs[0][runs[0].index("--metrics") + 1].split(",") == ncu_request_metrics(["root"])
    includes = [run[i + 1] for run in runs for i, a in enumerate(run) if a == "--nvtx-include"]
    assert includes == ["autoprofiler/", f"ap:{task.hash}/"]  # range replay: the task's own range only
    kernels = len(profile.kernels)
    assert kernels > 2 and profile.metrics["derived__kernel_count"] == kernels  # the root's, not 1
    ranged = parse_ncu_csv((FIXTURES / "torch_linear_gelu_range_replay.csv").read_text()).rows[0]
    name = "launch__waves_per_multiprocessor"  # occupancy: the range row's value
    assert profile.metrics[name] == pytest.approx(ranged[name])
    root_passes = kernel_passes(parse_ncu_csv(read("torch_mix_three_metrics.csv")).rows)
    assert profile.passes == root_passes + kernel_passes([ranged])  # both runs of this call
    assert [r.groups for r in profiler.runs] == [("root",), ("occupancy",)]
    fake_ncu.write_text("")
    few = Profiler(source="ncu", device="cuda", task_size="small", range_replay_above=1000)
    few.collect(tiny_task("short"), ["root", "occupancy"])
    runs = [json.loads(line) for line in fake_ncu.read_text().splitlines() if '"-o"' in line]
    assert len(runs) == 2 and not any("--replay-mode" in r for r in runs)  # few kernels: kernel replay


def test_range_replay_drops_the_metrics_ncu_refuses(fake_ncu, monkeypatch):
    """A metric ncu cannot collect over a range fails the run with "Metric X is not supported in range
    replay": the profiler drops what it names, runs again without it, and asks no later range run for
    it; kernel replay still asks for every metric."""
    from autoprofiler.profiling.groups import ncu_request_metrics

    refused = ["sm__warps_active.avg.pct_of_peak_sustained_active"]  # occupancy's counter
    monkeypatch.setenv("FAKE_NCU_RANGE_FIXTURE", str(FIXTURES / "torch_linear_gelu_range_replay.csv"))
    monkeypatch.setenv("FAKE_NCU_RANGE_REFUSE", ",".join(refused))
    profiler = Profiler(source="ncu", device="cuda", task_size="small", range_replay_above=2)
    profile = profiler.collect(tiny_task("refused"), ["root", "occupancy"])
    runs = [json.loads(line) for line in fake_ncu.read_text().splitlines() if '"-o"' in line]
    asked = [r[r.index("--metrics") + 1].split(",") for r in runs]
    assert ["--replay-mode" in r for r in runs] == [False, True, True]  # root, refused range, again
    assert refused[0] in asked[1] and refused[0] not in asked[2]
    assert profiler.range_dropped == set(refused) and refused[0] not in profile.metrics
    assert "launch__waves_per_multiprocessor" in profile.metrics  # the rest of the group is there
    fake_ncu.write_text("")
    profiler.collect(tiny_task("refused-again"), ["root", "occupancy"])
    runs = [json.loads(line) for line in fake_ncu.read_text().splitlines() if '"-o"' in line]
    assert len(runs) == 2 and refused[0] not in runs[1][runs[1].index("--metrics") + 1].split(",")
    assert refused[0] in ncu_request_metrics(["occupancy"])  # kernel replay: unchanged


def test_recording_seeds_range_replay_from_a_recorded_root(fake_ncu, monkeypatch, tmp_path):
    """A recording that already holds a task's root (e.g. from an earlier call) hands it to the profiler
    (Profiler.remember), so the missing groups go straight to range replay: one ncu run, no root again."""
    from autoprofiler.environments import LiveEnvironment
    from autoprofiler.rewriters import RuleRewriter

    monkeypatch.setenv("FAKE_NCU_RANGE_FIXTURE", str(FIXTURES / "torch_linear_gelu_range_replay.csv"))
    task = tiny_task("recorded")
    first = LiveEnvironment(
        Profiler(source="ncu", device="cuda", task_size="small"), RuleRewriter(), None, tmp_path
    )
    assert first.prefetch([task], ["root"]) == []
    first.close()
    fake_ncu.write_text("")
    profiler = Profiler(source="ncu", device="cuda", task_size="small", range_replay_above=2)
    env = LiveEnvironment(profiler, RuleRewriter(), None, tmp_path)  # a new process: nothing in memory
    assert env.prefetch([task], ["root", "occupancy"]) == []
    runs = [json.loads(line) for line in fake_ncu.read_text().splitlines() if '"-o"' in line]
    assert len(runs) == 1 and runs[0][runs[0].index("--replay-mode") + 1] == "range"
    assert env.profiler.snapshot(task, ["occupancy"]).metrics["launch__waves_per_multiprocessor"] > 0
