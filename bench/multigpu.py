"""The oracle sweep on 1, 2 and 4 GPU workers of one host: cells per minute, speedup over one worker,
each worker's GPU busy share, and whether the reward rows agree with the one-worker run.

    python3 bench/multigpu.py --config bench/multigpu_gpu.yaml --workers 1,2,4 --out bench/results/multigpu
    python bench/multigpu.py --config bench/multigpu_cpu.yaml --workers 1,2 --out bench/results/multigpu_cpu
    python bench/multigpu.py --table --workers 1 --agree-with datasets/recorded/h100 \
        --out bench/results/multigpu_1gpu_h100

Each setting is one run of ``workflows/oracle_sweep.py`` (``evaluate_only``: every rule action of every
task, no profiles) in its own process, on a fresh local Ray, with ``runtime.workers=N``: N ``GpuWorker``
actors, one per GPU (CUDA), or N CPU workers. Its recording goes to ``<out>_runs/wN``; ``--only 2,4``
runs some settings now and keeps the others' results (a device call at a time), ``--table`` only
rebuilds the page from the runs there.

- cells per minute: the action rows over the sweep's own ``seconds`` (``summary.json``: from the
  actors' start to the last row; Ray's own start is left out, and shown as the job's wall time).
- GPU busy share: ``nvidia-smi`` samples every GPU every 200 ms during the run; a worker's share is the
  fraction of its GPU's samples above 0% (the rows' ``worker`` names the GPU: ``host:gpu1:pid``).
- agreement with the first setting listed (``agreement``): the same outcome per cell (correct, or the
  same failure kind); how far each correct cell's speedup moved, beside how far the reference's own
  time moved (the same program timed in both runs: the timing noise between the runs); and per task,
  whether the action one run found best is within that noise of the best in the other.
- agreement with a recording (``--agree-with``, e.g. the committed recording of the card the sweep ran
  on): the same comparison of every setting against that recording's rows of the same cells (keys).
  It tells whether the Ray runtime's ``GpuWorker`` path reproduces what the recording measured, which a
  one-GPU machine can show without a second setting.

No setting reuses another's compiled kernels: each evaluation process compiles in its own temporary
folder (``TMPDIR``, ``TRITON_CACHE_DIR``: ``evaluation.workers.worker_env``). Writes ``<out>.json``
and ``<out>.md`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # polars only where the page is made: the GPU image has none (--table elsewhere)
    import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
COLUMNS = ["key", "task_id", "action", "correct", "error_kind", "speedup", "ref_ms", "effective_speedup"]


class GpuSampler:
    """``nvidia-smi`` utilization of every GPU every 200 ms in the background; ``stop()`` -> samples."""

    def __init__(self, enabled: bool):
        self.proc = None
        if enabled and shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-gpu=index,utilization.gpu",
                    "--format=csv,noheader,nounits",
                    "-lms",
                    "200",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )

    def stop(self) -> dict[str, list[float]]:
        """Utilization samples (percent) per GPU index, as strings ("0", "1", ...)."""
        if self.proc is None:
            return {}
        self.proc.terminate()
        out, _ = self.proc.communicate()
        samples: dict[str, list[float]] = {}
        for line in out.splitlines():
            index, _, util = line.partition(",")
            try:
                samples.setdefault(index.strip(), []).append(float(util))
            except ValueError:
                continue  # a torn last line
        return samples


def read_rows(out_dir: Path) -> pl.DataFrame:
    """The action rows of a sweep's reward table (polars)."""
    import polars as pl

    from autoprofiler.analysis import reward_frame

    rows = reward_frame(out_dir / "rewards")
    return rows.filter(pl.col("kind") == "action").select([*COLUMNS, "worker"])


def _drift(ratios: pl.Series) -> dict[str, float | None]:
    """Median, 90th percentile and largest ``|ratio - 1|`` on the log scale (0.05: 5% apart)."""
    ratios = ratios.drop_nulls()
    logs = ratios.filter(ratios > 0).log().abs()
    if logs.is_empty():
        return {"median": None, "p90": None, "max": None}
    return {
        "median": math.expm1(logs.median()),
        "p90": math.expm1(logs.quantile(0.9, "nearest")),
        "max": math.expm1(logs.max()),
    }


def agreement(base: pl.DataFrame, other: pl.DataFrame, floor: float = 0.05) -> dict:
    """How far ``other``'s action rows agree with ``base``'s (the same cells, by key).

    Returns: ``cells`` in both; ``outcome_agree`` (correct in both, or the same failure kind);
    ``speedup_drift`` and ``reference_drift`` (median, p90, max of |ratio - 1|, cells correct in both);
    ``tolerance`` = max(``floor``, twice the reference drift's p90); ``tasks``; ``best_exact``: tasks
    where both runs' best action (highest effective speedup) is the same; ``best_agree``: tasks where
    each run's best action is within the tolerance of the other run's best, in the other run (near-ties
    such as ``keep`` against ``channels_last`` count as agreeing); ``oracle_base``/``oracle_other``:
    geometric mean of each task's best.
    """
    import polars as pl

    from autoprofiler.analysis import geomean

    both = base.join(other, on="key", suffix="_other", how="inner")
    outcome = (pl.col("correct") == pl.col("correct_other")) & (
        pl.col("correct") | (pl.col("error_kind").fill_null("") == pl.col("error_kind_other").fill_null(""))
    )
    correct = both.filter(pl.col("correct") & pl.col("correct_other"))
    ref = _drift(correct["ref_ms_other"] / correct["ref_ms"])
    tolerance = max(floor, 2 * (ref["p90"] or 0.0))

    def best(rows: pl.DataFrame) -> dict[str, tuple[str, float]]:
        top = rows.sort(["task_id", "effective_speedup", "action"], descending=[False, True, False])
        top = top.group_by("task_id", maintain_order=True).first()
        return {t: (a, s) for t, a, s in top.select(["task_id", "action", "effective_speedup"]).iter_rows()}

    def speedup_of(rows: pl.DataFrame) -> dict[tuple[str, str], float]:
        return {(t, a): s for t, a, s in rows.select(["task_id", "action", "effective_speedup"]).iter_rows()}

    keys = set(both["key"])
    b_rows, o_rows = base.filter(pl.col("key").is_in(keys)), other.filter(pl.col("key").is_in(keys))
    b_best, o_best = best(b_rows), best(o_rows)
    b_of, o_of = speedup_of(b_rows), speedup_of(o_rows)
    agree = exact = 0
    for task, (b_action, b_top) in b_best.items():
        o_action, o_top = o_best[task]
        exact += b_action == o_action
        # each run's choice, judged in the other run, is within the tolerance of that run's best
        agree += o_of[(task, b_action)] >= o_top / (1 + tolerance) and b_of[(task, o_action)] >= b_top / (
            1 + tolerance
        )

    return {
        "cells": both.height,
        "outcome_agree": int(both.select(outcome.sum()).item() or 0),
        "speedup_drift": _drift(correct["speedup_other"] / correct["speedup"]),
        "reference_drift": ref,
        "tolerance": tolerance,
        "tasks": len(b_best),
        "best_exact": int(exact),
        "best_agree": int(agree),
        "oracle_base": geomean(s for _, s in b_best.values()) if b_best else None,
        "oracle_other": geomean(s for _, s in o_best.values()) if o_best else None,
    }


def busy_per_worker(rows: pl.DataFrame, samples: dict[str, list[float]]) -> dict[str, dict]:
    """Per worker (``host:gpuN:pid`` in the rows): its cells, and its GPU's busy share and mean use."""
    out = {}
    for worker, cells in rows.group_by("worker").len().sort("worker").iter_rows():
        parts = worker.split(":")
        gpu = parts[1] if len(parts) == 3 else None
        util = samples.get(gpu[3:], []) if gpu and gpu.startswith("gpu") else []
        out[worker] = {
            "gpu": gpu,
            "cells": cells,
            "busy_share": sum(u > 0 for u in util) / len(util) if util else None,
            "mean_util": sum(util) / len(util) if util else None,
        }
    return out


def run_setting(config: Path, workers: int, out_dir: Path, overrides: list[str], sample: bool) -> dict:
    """One oracle sweep with ``workers`` workers into ``out_dir``; its timing, GPU samples and log."""
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        str(ROOT / "workflows" / "oracle_sweep.py"),
        "--config",
        str(config),
        f"out_dir={out_dir}",
        f"runtime.workers={workers}",
        "runtime.ray=true",
        *overrides,
    ]
    sampler = GpuSampler(sample)
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    samples = sampler.stop()
    log = out_dir.with_name(out_dir.name + ".log")
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"the sweep with {workers} worker(s) failed (rc {done.returncode}): see {log}")
    summary = json.loads((out_dir / "summary.json").read_text())
    return {
        "workers": workers,
        "wall_seconds": wall,
        "seconds": summary["seconds"],
        "failures": len(summary.get("failures", [])),
        "complete": summary.get("complete"),
        "device": (summary.get("provenance") or {}).get("device", ""),
        "gpu_samples": samples,
    }


def results_of(runs: Path, settings: list[int], recording: pl.DataFrame | None = None) -> list[dict]:
    """Every setting's result (``wN.json`` beside its recording), with its rows' counts and agreement
    with the first setting (and with ``recording``'s action rows, when given)."""
    results = []
    base_rows = None
    for n in settings:
        path = runs / f"w{n}.json"
        if not path.exists():
            continue
        result = json.loads(path.read_text())
        rows = read_rows(runs / f"w{n}")
        result["cells"] = rows.height
        result["correct"] = int(rows["correct"].sum() or 0)
        result["per_worker"] = busy_per_worker(rows, result.pop("gpu_samples", {}))
        if base_rows is None:
            base_rows, result["base"] = rows, True
        result["agreement"] = agreement(base_rows, rows)
        if recording is not None:
            result["agreement_recording"] = agreement(recording, rows)
        results.append(result)
    return results


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def table(results: list[dict]) -> str:
    head = [
        "workers",
        "cells",
        "correct",
        "seconds",
        "cells/min",
        "vs first",
        "job wall s",
        "per worker: GPU, cells, busy",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    first = results[0] if results else None
    for r in results:
        rate = 60 * r["cells"] / r["seconds"] if r["seconds"] else 0.0
        first_rate = 60 * first["cells"] / first["seconds"] if first and first["seconds"] else 0.0
        ratio = f"{rate / first_rate:.2f}x" if first_rate else "-"
        per = "; ".join(
            f"{w['gpu'] or 'cpu'} {w['cells']} ({_pct(w['busy_share'])})" for w in r["per_worker"].values()
        )
        lines.append(
            f"| {r['workers']} | {r['cells']} | {r['correct']} | {r['seconds']:.1f} | {rate:.1f} | {ratio} | "
            f"{r['wall_seconds']:.1f} | {per} |"
        )
    lines += ["", "Agreement with the first setting (cells correct in both for the drifts):", ""]
    lines += agreement_table(results, "agreement", "first")
    if results and "agreement_recording" in results[0]:
        lines += ["", "Agreement with the recording (its rows of the same cells, as the base):", ""]
        lines += agreement_table(results, "agreement_recording", "recording")
    return "\n".join(lines) + "\n"


def agreement_table(results: list[dict], field: str, base: str) -> list[str]:
    """The markdown lines of every setting's ``agreement`` dict under ``field``, against ``base``."""
    head = [
        "workers",
        "same outcome",
        "speedup drift median / p90 / max",
        "reference drift median / p90",
        "tolerance",
        "same best action: exact / within tolerance",
        f"oracle geomean ({base}, this)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in results:
        a = r[field]
        s, ref = a["speedup_drift"], a["reference_drift"]
        oracle = "-" if a["oracle_base"] is None else f"{a['oracle_base']:.3f}x, {a['oracle_other']:.3f}x"
        lines.append(
            f"| {r['workers']} | {a['outcome_agree']}/{a['cells']} | "
            f"{_pct(s['median'])} / {_pct(s['p90'])} / {_pct(s['max'])} | "
            f"{_pct(ref['median'])} / {_pct(ref['p90'])} | {_pct(a['tolerance'])} | "
            f"{a['best_exact']} / {a['best_agree']} of {a['tasks']} | {oracle} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", help="an oracle_sweep.yaml (evaluate_only) for every setting")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts; the first is the base")
    p.add_argument("--only", default="", help="run only these settings now (the others' results are kept)")
    p.add_argument("--table", action="store_true", help="run nothing: the page from the runs there")
    p.add_argument("--out", required=True, help="output path stem (.json, .md; runs in <out>_runs/)")
    p.add_argument("--no-gpu-sample", action="store_true")
    p.add_argument("--agree-with", help="a recording (with rewards/) to compare every setting's rows with")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every sweep")
    args = p.parse_args(argv)
    try:
        settings = [int(w) for w in args.workers.split(",")]
        now = [int(w) for w in args.only.split(",")] if args.only else settings
    except ValueError:
        p.error(f"--workers/--only: expected comma-separated integers, got {args.workers!r}/{args.only!r}")
    if not args.table and not (args.config and Path(args.config).is_file()):
        p.error(f"--config: expected an oracle_sweep config file, got {args.config!r}")
    if args.agree_with and not (Path(args.agree_with) / "rewards").is_dir():
        p.error(f"--agree-with: expected a recording with a rewards/ table, got {args.agree_with!r}")
    out = Path(args.out)
    runs = out.parent / (out.name + "_runs")
    runs.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not args.table:
        for n in now:
            result = run_setting(Path(args.config), n, runs / f"w{n}", args.overrides, not args.no_gpu_sample)
            result |= {"cpus": os.cpu_count(), "loadavg": os.getloadavg(), "argv": argv or sys.argv[1:]}
            (runs / f"w{n}.json").write_text(json.dumps(result) + "\n")
            print(f"{n} worker(s): {result['seconds']:.1f} s, {result['failures']} failures", flush=True)
    try:
        import polars  # noqa: F401
    except ImportError:
        print(f"no polars here: make the page elsewhere with --table --out {out} (runs: {runs})")
        return 0
    recording = read_rows(Path(args.agree_with)) if args.agree_with else None
    results = results_of(runs, settings, recording)
    out.with_suffix(".json").write_text(json.dumps({"results": results}, indent=1) + "\n")
    page = header(results) + table(results)
    out.with_suffix(".md").write_text(page)
    print(page)
    return 0


def header(results: list[dict]) -> str:
    """The page's first lines: the command of each run and the machine that ran it."""
    lines = []
    for r in results:
        load = tuple(round(x, 2) for x in r.get("loadavg", ()))
        lines.append(
            f"- {r['workers']} worker(s): `bench/multigpu.py {' '.join(r.get('argv', []))}` on "
            f"{r.get('device') or '-'}, {r.get('cpus')} CPUs, load average after {load}"
        )
    return "# bench/multigpu.py\n\n" + "\n".join(lines) + "\n\n"


if __name__ == "__main__":
    sys.exit(main())
