"""Run a program under Nsight Compute and read the report back.

One run: ``ncu --nvtx --nvtx-include "autoprofiler/" --metrics a,b,c --clock-control none
--target-processes all -o REPORT -f python -m autoprofiler.profiling._program job.json``, then
``ncu -i REPORT.ncu-rep --csv --page raw --print-units base`` and :func:`parse_ncu_csv`.

The program (``_program.py``) wraps each task's one forward call in a push/pop range ``ap:<task hash>``
nested in a range ``autoprofiler``; ncu profiles the kernels inside ``autoprofiler`` and the NVTX column
of each row names the task (:func:`split_by_task`), so many tasks share one process (batch mode).
``Profiler(nvtx_filter="per_task")`` filters on the task ranges instead (one ``--nvtx-include
"ap:<hash>/"`` per task), should a ncu version not match kernels in nested ranges.

Raw CSV layout (see ``tests/fixtures/ncu/``): a quoted header line, a units line, one row per kernel;
numbers with thousands separators (``"1,999,260,019.96"``), ``n/a`` and empty cells for missing values;
``==PROF==``/``==WARNING==`` lines and the program's own output may come before or between the rows.

Example:
    >>> table = parse_ncu_csv(open("tests/fixtures/ncu/torch_mix_three_metrics.csv").read())
    >>> len(table.rows), table.units["gpu__time_duration.sum"], table.rows[0]["gpu__time_duration.sum"]
    (9, 'ns', 2683360.0)
"""

from __future__ import annotations

import csv
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

NVTX_OUTER_RANGE = "autoprofiler"
TASK_RANGE_PREFIX = "ap:"
PASSES_COLUMN = "profiler__replayer_passes"
_TASK_RANGE_RE = re.compile(r"ap:([0-9A-Za-z_\-]+)")
_NUMBER_RE = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d+)(\.\d*)?([eE][-+]?\d+)?$")
_MISSING = {"", "n/a", "N/A", "nan", "NaN", "-nan", "inf", "-inf"}
_PERMISSION_MARKER = "ERR_NVGPUCTRPERM"
_NO_KERNELS_MARKERS = ("No kernels were profiled",)
_RANGE_UNSUPPORTED = re.compile(r"Metric (\S+) is not supported in range replay")

# Units ncu may print when not in base mode, mapped to (base unit, factor).
_TIME_UNITS = {
    "ns": 1.0,
    "nsecond": 1.0,
    "us": 1e3,
    "usecond": 1e3,
    "ms": 1e6,
    "msecond": 1e6,
    "s": 1e9,
    "second": 1e9,
}
_PREFIX = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_PREFIXABLE = ("byte", "byte/s", "byte/second", "hz", "inst", "cycle", "sector", "request", "warp", "thread")


class ProfilerError(RuntimeError):
    """Base class of every profiling failure; ``failures``: task hash -> reason for a batch's failed tasks."""

    failures: dict[str, str] = {}


class NcuNotFound(ProfilerError):
    """The ``ncu`` executable is not on PATH (or not at the given path)."""


class CountersNotPermitted(ProfilerError):
    """The driver refused access to GPU performance counters (ERR_NVGPUCTRPERM)."""


class NoKernelsProfiled(ProfilerError):
    """The NVTX range of a task launched no kernel (or the filter matched none)."""


class ProgramFailed(ProfilerError):
    """The profiled program crashed, exited non-zero or timed out."""


# --- parsing ---------------------------------------------------------------------------------------
@dataclass
class NcuTable:
    """The raw page of an ncu report: one dict per kernel, values parsed.

    Attributes:
        columns: header names in file order.
        units: column -> unit string (``""`` when none), after conversion to base units.
        rows: one dict per kernel row; numbers are floats, missing values ``None``, text stays text.
    """

    columns: list[str]
    units: dict[str, str]
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def nvtx_columns(self) -> list[str]:
        return [c for c in self.columns if "Push/Pop_Range" in c or "Start/Stop_Range" in c]


def parse_value(text: str) -> float | str | None:
    """One CSV cell: a float (thousands separators removed), ``None`` when missing, else the text.

    >>> parse_value("1,999,260,019.96"), parse_value("n/a"), parse_value("(256, 1, 1)")
    (1999260019.96, None, '(256, 1, 1)')
    """
    cell = text.strip()
    if cell in _MISSING:
        return None
    if _NUMBER_RE.match(cell):
        return float(cell.replace(",", ""))
    return cell


def _unit_scale(unit: str) -> tuple[str, float]:
    if unit in _TIME_UNITS:
        return "ns", _TIME_UNITS[unit]
    if len(unit) > 1 and unit[0] in _PREFIX and unit[1:] in _PREFIXABLE:
        return unit[1:], _PREFIX[unit[0]]
    if unit.endswith("hz") and unit[:-2] in ("K", "M", "G"):  # "Ghz"
        return "hz", _PREFIX[unit[0]]
    return unit, 1.0


def parse_ncu_csv(text: str) -> NcuTable:
    """Parse ``ncu --csv --page raw`` output (from ``-i REPORT`` or straight from a profiling run).

    Lines that are not CSV records (``==PROF==``, ``==WARNING==``, the program's prints) are skipped
    wherever they appear; the first record whose first cell is ``ID`` is the header, the next the units.

    Raises:
        NoKernelsProfiled: no header, or a header with no kernel rows.
    """
    records = [line for line in text.splitlines() if line.startswith('"')]
    start = next((i for i, line in enumerate(records) if line.startswith('"ID"')), None)
    if start is None:
        raise NoKernelsProfiled("ncu printed no CSV header (no kernel was profiled)")
    parsed = list(csv.reader(records[start:]))
    header = parsed[0]
    unit_row = parsed[1] if len(parsed) > 1 else [""] * len(header)
    # The units row has an empty ID cell; tolerate its absence (then the row is a kernel).
    if unit_row and unit_row[0].strip() != "":
        unit_row, body = [""] * len(header), parsed[1:]
    else:
        body = parsed[2:]
    units, scales = {}, {}
    for column, unit in zip(header, unit_row, strict=False):
        units[column], scales[column] = _unit_scale(unit.strip())
    rows = []
    for record in body:
        if len(record) != len(header):
            log.warning("skipping a CSV record with %d cells (header has %d)", len(record), len(header))
            continue
        row: dict[str, Any] = {}
        for column, cell in zip(header, record, strict=True):
            value = parse_value(cell)
            if isinstance(value, float) and scales[column] != 1.0:
                value *= scales[column]
            row[column] = value
        rows.append(row)
    if not rows:
        raise NoKernelsProfiled("ncu report holds no kernel rows")
    return NcuTable(columns=header, units=units, rows=rows)


def range_names(row: dict[str, Any], nvtx_columns: list[str]) -> list[str]:
    """NVTX push/pop range names on the row's stack, outermost first.

    A cell looks like ``804  "<default domain>:target:none:none:none:none:none:none"``: one quoted
    ``domain:name:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg`` entry per range (names may hold ``:``).
    """
    names = []
    for column in nvtx_columns:
        value = row.get(column)
        if not isinstance(value, str):
            continue
        for entry in re.findall(r'"([^"]*)"', value):
            parts = entry.split(":")
            if len(parts) >= 8:
                names.append(":".join(parts[1:-6]))
    return names


def task_of_row(row: dict[str, Any], nvtx_columns: list[str]) -> str | None:
    """The task id named by the row's NVTX stack (``ap:<id>``), or ``None``."""
    for column in nvtx_columns:
        value = row.get(column)
        if isinstance(value, str):
            match = _TASK_RANGE_RE.search(value)
            if match:
                return match.group(1)
    return None


def split_by_task(table: NcuTable, task_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Kernel rows per task id, in profiling order (``ID`` column).

    A single task takes every row even when the NVTX column is absent (e.g. range replay captures).
    """
    out: dict[str, list[dict[str, Any]]] = {t: [] for t in task_ids}
    rows = sorted(table.rows, key=lambda r: r.get("ID") if isinstance(r.get("ID"), float) else 0.0)
    nvtx = table.nvtx_columns
    for row in rows:
        task = task_of_row(row, nvtx)
        if task is None and len(task_ids) == 1:
            task = task_ids[0]
        if task in out:
            out[task].append(row)
        else:
            log.warning("kernel %r is in no known task range (%s)", row.get("Kernel Name"), task)
    return out


def kernel_passes(rows: list[dict[str, Any]]) -> int:
    """Replay passes spent on these kernels: the largest ``profiler__replayer_passes`` (0 if absent)."""
    values = [r.get(PASSES_COLUMN) for r in rows]
    values = [int(v) for v in values if isinstance(v, float)]
    return max(values, default=0)


# --- running ---------------------------------------------------------------------------------------
def find_ncu(ncu_path: str = "ncu") -> str:
    """Absolute path of the ncu executable.

    Raises:
        NcuNotFound: not on PATH / not there, with where we looked.
    """
    found = shutil.which(ncu_path)
    if found is None:
        raise NcuNotFound(
            f"Nsight Compute executable {ncu_path!r} not found (PATH={os.environ.get('PATH', '')!r}); "
            "install Nsight Compute or pass ncu_path=/path/to/ncu"
        )
    return found


def build_ncu_command(
    ncu: str,
    report: Path,
    metrics: list[str] | None,
    program: list[str],
    *,
    nvtx_includes: tuple[str, ...] = (NVTX_OUTER_RANGE,),
    extra_args: tuple[str, ...] = (),
) -> list[str]:
    """The profiling command line; ``metrics=None`` with e.g. ``extra_args=("--set", "full")``.

    >>> build_ncu_command("ncu", Path("/tmp/r"), ["a.sum", "b.avg"], ["python", "p.py"])[:6]
    ['ncu', '--nvtx', '--nvtx-include', 'autoprofiler/', '--metrics', 'a.sum,b.avg']
    """
    cmd = [ncu, "--nvtx"]
    for name in nvtx_includes:
        cmd += ["--nvtx-include", f"{name}/"]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    cmd += list(extra_args)
    cmd += ["--clock-control", "none", "--target-processes", "all", "-o", str(report), "-f"]
    return cmd + list(program)


def build_export_command(ncu: str, report: Path) -> list[str]:
    return [ncu, "-i", str(report), "--csv", "--page", "raw", "--print-units", "base"]


@dataclass
class Completed:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_command(
    cmd: list[str], *, env: dict[str, str] | None, timeout_s: float, cwd: str | None = None
) -> Completed:
    """Run in a new process group; on timeout kill the whole group and raise ProgramFailed."""
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        stdout, stderr = proc.communicate()
        raise ProgramFailed(
            f"timed out after {timeout_s:.0f} s: {' '.join(cmd[:3])} ...\n{tail(stdout + stderr)}"
        ) from None
    return Completed(proc.returncode, stdout, stderr, time.monotonic() - start)


def range_unsupported(output: str) -> list[str]:
    """The metrics an ncu error output says range replay cannot collect.

    >>> range_unsupported("==ERROR== Metric sm__x.sum is not supported in range replay")
    ['sm__x.sum']
    """
    return list(dict.fromkeys(_RANGE_UNSUPPORTED.findall(output)))


def tail(text: str, lines: int = 25) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def check_ncu_output(done: Completed, what: str) -> None:
    """Map a finished ncu invocation to the error classes (or return when it went fine)."""
    output = done.stdout + "\n" + done.stderr
    if _PERMISSION_MARKER in output:
        raise CountersNotPermitted(
            "ncu: ERR_NVGPUCTRPERM, the driver does not allow this user to read GPU performance counters. "
            "Fix: run as root (sudo), or allow all users: put "
            "'options nvidia NVreg_RestrictProfilingToAdminUsers=0' in /etc/modprobe.d/ and reload nvidia "
            "module (check with 'grep RmProfilingAdminOnly /proc/driver/nvidia/params', 0 means allowed).\n"
            + tail(output, 10)
        )
    if any(marker in output for marker in _NO_KERNELS_MARKERS) and done.returncode == 0:
        raise NoKernelsProfiled(f"{what}: ncu profiled no kernel in the NVTX range\n{tail(output, 10)}")
    if done.returncode != 0:
        raise ProgramFailed(f"{what} exited with code {done.returncode}\n{tail(output)}")


@dataclass
class NcuRun:
    """One profiled process: the parsed table, the ncu wall time and the console output."""

    table: NcuTable
    seconds: float
    csv_text: str
    console: str


def profile_command(
    program: list[str],
    metrics: list[str] | None,
    *,
    workdir: Path,
    env: dict[str, str] | None = None,
    timeout_s: float = 600.0,
    ncu_path: str = "ncu",
    extra_args: tuple[str, ...] = (),
    nvtx_includes: tuple[str, ...] = (NVTX_OUTER_RANGE,),
    name_ranges: bool = False,
) -> NcuRun:
    """Profile ``program`` (an argv) under ncu, export the raw page and parse it.

    With ``name_ranges`` (batch mode), rows must name their task range: when the export has no NVTX
    column naming one, a second export with ``--print-nvtx-rename kernel`` supplies it.

    Raises:
        NcuNotFound, CountersNotPermitted, NoKernelsProfiled, ProgramFailed.
    """
    ncu = find_ncu(ncu_path)
    report = workdir / "report"
    cmd = build_ncu_command(ncu, report, metrics, program, nvtx_includes=nvtx_includes, extra_args=extra_args)
    log.info("profiling: %s", " ".join(cmd))
    start = time.monotonic()
    done = run_command(cmd, env=env, timeout_s=timeout_s, cwd=str(workdir))
    check_ncu_output(done, "ncu profiling run")
    rep = report.with_suffix(".ncu-rep")
    if not rep.exists():
        raise NoKernelsProfiled(
            f"ncu wrote no report {rep} (no kernel profiled?)\n{tail(done.stdout + done.stderr)}"
        )
    exported = run_command(build_export_command(ncu, rep), env=env, timeout_s=timeout_s, cwd=str(workdir))
    check_ncu_output(exported, "ncu report export")
    table = parse_ncu_csv(exported.stdout)
    if name_ranges and not any(task_of_row(r, table.nvtx_columns) for r in table.rows):
        # The export printed no NVTX stack naming the tasks: ask ncu to rename each kernel after its
        # innermost push/pop range (ap:<task>) and carry that name over by kernel ID.
        renamed_cmd = build_export_command(ncu, rep) + ["--print-nvtx-rename", "kernel"]
        renamed = run_command(renamed_cmd, env=env, timeout_s=timeout_s, cwd=str(workdir))
        check_ncu_output(renamed, "ncu report export (NVTX rename)")
        add_renamed_ranges(table, parse_ncu_csv(renamed.stdout))
    seconds = time.monotonic() - start
    log.info(
        "ncu: %d kernel rows in %.1f s (profiled process %.1f s, export %.1f s)",
        len(table.rows),
        seconds,
        done.seconds,
        seconds - done.seconds,
    )
    return NcuRun(table, seconds, exported.stdout, done.stdout + done.stderr)


RENAMED_RANGE_COLUMN = "Push/Pop_Range (from --print-nvtx-rename kernel)"


def add_renamed_ranges(table: NcuTable, renamed: NcuTable) -> None:
    """Copy the NVTX-renamed kernel names of ``renamed`` into ``table`` (by ``ID``) as a range column."""
    by_id = {row.get("ID"): row.get("Kernel Name") for row in renamed.rows}
    table.columns.append(RENAMED_RANGE_COLUMN)
    table.units[RENAMED_RANGE_COLUMN] = ""
    for row in table.rows:
        name = by_id.get(row.get("ID"))
        row[RENAMED_RANGE_COLUMN] = f'"<renamed>:{name}:none:none:none:none:none:none"' if name else None


def ncu_version(ncu_path: str = "ncu") -> str:
    """``ncu --version`` reduced to the version (``"2025.3.1.0"``), or ``"unknown"``."""
    path = shutil.which(ncu_path)
    if path is None:
        return "unknown"
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    match = re.search(r"Version\s+([0-9][0-9.]*)", done.stdout)
    return match.group(1) if match and done.returncode == 0 else "unknown"


def gpu_identity(device: str = "cuda") -> tuple[str, str]:
    """(GPU name, driver version) from nvidia-smi for ``cuda``/``cuda:N``, or ``("unknown", "unknown")``.

    The GPU is the one the device is in this process (``provenance.visible_gpu``: a Ray actor's "cuda"
    is the GPU Ray gave it, which nvidia-smi, ignoring ``CUDA_VISIBLE_DEVICES``, numbers by the host).
    """
    from autoprofiler.provenance import visible_gpu

    index = visible_gpu(device if device.startswith("cuda") else "cuda") or "0"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "unknown", "unknown"
    try:
        done = subprocess.run(
            [smi, f"--id={index}", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown", "unknown"
    parts = [p.strip() for p in done.stdout.strip().splitlines()[0].split(",")] if done.stdout.strip() else []
    if done.returncode != 0 or len(parts) < 2:
        return "unknown", "unknown"
    return parts[0], parts[1]
