"""What the learner costs over a large replay table: wall time per phase, peak memory, evaluations.

    python bench/learner_scale.py    # N = 500, 2000, 6000 (+ 6000 over a Ray replay actor); ~1.5 min
    python bench/learner_scale.py --sizes 500 --ray-sizes --keep runs/scale   # one size, kept on disk
    python bench/learner_scale.py --render --before bench/results/learner_scale_before.json  # page only

Writes ``bench/results/learner_scale.md`` and ``.json`` (``--out``) and prints the table.

The tasks are **resampled**, not new (``bench/resample_recording.py``): N copies of the tasks the
main job replays (every ncu group and every rule action recorded; 205 on 2026-12-05), drawn with
replacement with a fixed seed, each a distinct task (``resampled/<original id>/<k>``, ``origin``
``resampled_from=<original id>``) whose profile and reward rows are the original's under its own hash
and recomputed keys, reward times jittered (``--jitter``); written with the project's table writers
to a temporary folder (never committed) and read back by the real ``ReplayEnvironment``.

Each size then runs the learner as ``workflows/train.py environment=replay`` does: train.yaml's
``test_fraction`` and ``learn`` settings, the replay command's probes ``[algorithm, memory, latency,
compute]``, ``trees/seed.json``, ncu source, rule rewriter, statistical proposer, checkpoints in a run
folder, then the held-out policy comparison and the oracle analysis (train.py's report is not built).
The replay answers in this process (``runtime.ray=false``), or, for ``--ray-sizes``, through one
``ReplayWorker`` Ray actor (train.py's default ``runtime``). Every step runs in a fresh child process,
so each peak RSS (``ru_maxrss``) is that step's own; a Ray run adds the peak RSS (``VmHWM``) of the Ray
processes it started.

What it is not: copies are pseudo-replicates, so a paired test at large N counts one task's gain many
times; its accept/reject there is not evidence about learning. The table is about cost.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resample_recording import SOURCE, original_tasks, resampled_tasks, write_resampled  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRAIN_YAML = ROOT / "workflows" / "train.yaml"
SIZES = (500, 2000, 6000)
PROBES = ("algorithm", "memory", "latency", "compute")  # the replay command's (train.yaml's are torch's)
#: phase name -> the Learner method timed for it (every call, summed)
WRAPPED = {"prepare": "_prepare", "probe": "probe", "decisions": "decide", "checkpoints": "_checkpoint"}


def peak_rss_mb() -> float:
    """This process's resident-set high-water mark in MiB (``ru_maxrss`` is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def rss_mb() -> float | None:
    """This process's resident set now, in MiB (Linux ``/proc/self/statm``; None elsewhere)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20
    except (OSError, IndexError, ValueError):
        return None


# --- the learner run -----------------------------------------------------------------------------------
@dataclass
class Clock:
    """Wall and CPU seconds and resident memory per named phase; ``wrap`` times every call of a method.

    CPU seconds (``time.process_time``: this process, all its threads) hardly move when other jobs
    share the cores; wall seconds do.
    """

    seconds: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    rss: dict[str, list[float | None]] = field(default_factory=dict)  # [now, peak so far] after a phase
    calls: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # (wall, cpu) per call

    def phase(self, name: str, fn: Callable[[], Any]) -> Any:
        t0, c0 = time.perf_counter(), time.process_time()
        result = fn()
        self.seconds[name] = round(time.perf_counter() - t0, 3)
        self.cpu[name] = round(time.process_time() - c0, 3)
        now = rss_mb()
        peak = max(peak_rss_mb(), now or 0.0)  # ru_maxrss and statm count pages a little differently
        self.rss[name] = [None if now is None else round(now, 1), round(peak, 1)]
        return result

    def wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def timed(*args, **kwargs):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return method(*args, **kwargs)
            finally:
                self.calls.setdefault(name, []).append((time.perf_counter() - t0, time.process_time() - c0))

        return timed

    def total(self, name: str, which: int = 0) -> float:
        """Summed wall (``which=0``) or CPU (1) seconds of a wrapped method's calls."""
        return round(sum(call[which] for call in self.calls.get(name, [])), 3)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux ``/proc``)."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _vm_hwm_mb(pid: int) -> float:
    """A process's peak resident set (``VmHWM``) in MiB; 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def _ray_memory(runner: Any) -> dict[str, Any]:
    """Peak RSS of the replay actor and of every process this driver's Ray session started."""
    actor = runner.info()[0]["pid"]
    procs = _descendants(os.getpid())
    return {
        "actor_peak_rss_mb": round(_vm_hwm_mb(actor), 1),
        "processes": len(procs),
        "sum_peak_rss_mb": round(sum(_vm_hwm_mb(p) for p in procs), 1),
    }


def run_learner(folder: Path, tasks: Sequence, run_dir: Path, ray: bool = False) -> dict[str, Any]:
    """The learner over the recording in ``folder`` as train.py runs it; what each phase cost.

    ``ray``: the replay answers through one ``ReplayWorker`` actor (train.py's ``runtime.ray=true``),
    else in this process.
    """
    from autoprofiler.analysis import evaluate_policies, oracle_analysis, outcome_matrix, split_tasks
    from autoprofiler.environments import ReplayEnvironment
    from autoprofiler.learning import LearnConfig, Learner, StatisticalProposer
    from autoprofiler.policies import held_out_policies
    from autoprofiler.profiling import CONFIGURATIONS, GROUPS
    from autoprofiler.rewriters import RuleRewriter
    from autoprofiler.tree import load_tree
    from autoprofiler.workflow import make_runner

    cfg = yaml.safe_load(TRAIN_YAML.read_text())
    clock = Clock()
    rewriter = RuleRewriter()

    def environment():
        runner = make_runner({"ray": ray, "workers": None}, recording=folder, source=SOURCE)
        env = ReplayEnvironment(folder, rewriter, SOURCE, runner=runner)
        if ray:
            runner.info()  # the actor has read the recording
        return env

    env = clock.phase("environment", environment)

    def select():
        full, _ = env.fully_recorded(tasks)
        train, test = split_tasks(full, cfg["test_fraction"])
        names = {g for g, spec in GROUPS.items() if spec.source == SOURCE}
        return full, train, test, sorted(names & {g for t in train for g in env.profiler.recorded_groups(t)})

    full, train, test, groups = clock.phase("select", select)
    tree0 = load_tree(ROOT / "trees" / "seed.json", catalog=GROUPS)
    probes = {name: tuple(CONFIGURATIONS[name]) for name in PROBES}
    learner = Learner(
        env,
        train,
        StatisticalProposer(),
        LearnConfig(**cfg["learn"]),
        out_dir=run_dir,
        rewriter=rewriter,
        catalog=GROUPS,
        probe_configurations=probes,
        groups=groups,
    )
    for name in WRAPPED.values():  # instance attributes: fit calls these
        setattr(learner, name, clock.wrap(name, getattr(learner, name)))
    tree = clock.phase("fit", lambda: learner.fit(tree0))
    policies = held_out_policies(tree0, tree, probes, groups)
    _, summary = clock.phase("held_out", lambda: evaluate_policies(test, policies, env, rewriter))
    oracle = clock.phase(
        "oracle", lambda: oracle_analysis(outcome_matrix(test + train, probes, env, rewriter))
    )
    ray_memory = _ray_memory(env.runner) if ray else None
    env.close()
    if ray:
        import ray as ray_module

        ray_module.shutdown()
    s = learner.summary()
    return {
        "ray": ray,
        "tasks": len(full),
        "resampled": sum(
            t.id.startswith("resampled/") and t.origin.startswith("resampled_from=") for t in full
        ),
        "train": len(train),
        "test": len(test),
        "seconds": {**clock.seconds, **{k: clock.total(f) for k, f in WRAPPED.items()}},
        "cpu_seconds": {**clock.cpu, **{k: clock.total(f, 1) for k, f in WRAPPED.items()}},
        "decision_seconds": [round(wall, 4) for wall, _ in clock.calls.get("decide", [])],
        "rss_mb": clock.rss,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "ray_memory": ray_memory,
        "decisions": s["evaluations"]["decisions"],
        "accepted": s["evaluations"]["accepted"],
        "evaluations": s["evaluations"],
        "env": env.stats.as_dict(),
        "held_out_geomean": {k: round(v["geomean_speedup"], 6) for k, v in summary.items()},
        "oracle": {k: oracle[k] for k in ("tasks", "best_static", "relative_gain", "relative_gain_ci")},
        "learned_tree": tree.fingerprint(),
    }


# --- the core function and the driver ------------------------------------------------------------------
def measure(n: int, work: Path, seed: int = 0, jitter: float = 0.02) -> dict[str, Any]:
    """Resample ``n`` tasks into ``work/recording`` and run the learner on them, in this process.

    Returns one result row (``{"n", "resample", "learn"}``, what ``table`` and ``markdown`` take); its
    peak RSS figures are this process's, both steps together. ``main`` runs each step in a process of
    its own instead, so their memory is measured apart.
    """
    t0 = time.perf_counter()
    originals = original_tasks()
    pairs = resampled_tasks(originals, n, seed)
    counts = write_resampled(pairs, work / "recording", seed=seed, jitter=jitter)
    resample = {
        **counts,
        "originals": len(originals),
        "seconds": round(time.perf_counter() - t0, 3),
        "peak_rss_mb": round(peak_rss_mb(), 1),
    }
    t0, c0 = time.perf_counter(), time.process_time()
    learn = run_learner(work / "recording", [c for c, _ in pairs], work / "run")
    return {
        "n": n,
        "resample": resample,
        "learn": {
            **learn,
            "process_seconds": round(time.perf_counter() - t0, 2),
            "process_cpu_seconds": round(time.process_time() - c0, 2),
        },
    }


def _step(args: argparse.Namespace) -> dict[str, Any]:
    """One step in this (child) process: ``resample`` or ``learn`` / ``learn-ray``."""
    work = Path(args.work)
    originals = original_tasks()
    pairs = resampled_tasks(originals, args.n, args.seed)
    if args.step == "resample":
        t0 = time.perf_counter()
        counts = write_resampled(pairs, work / "recording", seed=args.seed, jitter=args.jitter)
        return {
            **counts,
            "originals": len(originals),
            "seconds": round(time.perf_counter() - t0, 3),
            "peak_rss_mb": round(peak_rss_mb(), 1),
        }
    ray = args.step == "learn-ray"
    return run_learner(work / "recording", [c for c, _ in pairs], work / ("run-ray" if ray else "run"), ray)


def _child(step: str, n: int, work: Path, seed: int, jitter: float) -> dict[str, Any]:
    """Run one step in a fresh interpreter; its result and the child's wall time (imports included)."""
    out = work / f"{step}.json"
    cmd = [
        sys.executable,
        __file__,
        "--step",
        step,
        "--n",
        str(n),
        "--work",
        str(work),
        "--seed",
        str(seed),
        "--jitter",
        str(jitter),
        "--result",
        str(out),
    ]
    t0 = time.perf_counter()
    start = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = start.ru_utime + start.ru_stime
    subprocess.run(cmd, check=True)
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        **json.loads(out.read_text()),
        "process_seconds": round(time.perf_counter() - t0, 2),
        # CPU of the child and of any process it started and reaped (Ray's, for a Ray run)
        "process_cpu_seconds": round(cpu.ru_utime + cpu.ru_stime - cpu0, 2),
    }


def _row(r: dict[str, Any]) -> str:
    L, W, s, ev = r["learn"], r["resample"], r["learn"]["seconds"], r["learn"]["evaluations"]
    runner = "Ray actor" if L["ray"] else "in-process"
    peak = _peak(L)
    cells = [
        f"{L['tasks']:,} ({L['train']:,}/{L['test']:,})",
        runner,
        f"{W['seconds']:.1f}",
        f"{W['peak_rss_mb']:,.0f}",
        f"{s['environment']:.1f}",
        f"{s['prepare']:.1f}",
        f"{s['probe']:.1f}",
        f"{L['decisions']} ({L['accepted']})",
        f"{s['decisions']:.1f}",
        f"{max(L['decision_seconds'] or [0]):.2f}",
        f"{s['checkpoints']:.1f}",
        f"{s['held_out']:.1f}",
        f"{s['oracle']:.1f}",
        f"{L['process_seconds']:.1f} ({L['process_cpu_seconds']:.1f})",
        peak,
        f"{ev['sweep']:,}",
        f"{ev['spent']:,} / {ev['naive']:,} ({ev['saved_fraction']:.0%} saved)",
        f"{L['env']['evaluations']:,}",
    ]
    return "| " + " | ".join(cells) + " |"


HEAD = [
    "N tasks (train/test)",
    "replay",
    "write recording s",
    "its peak RSS MiB",
    "environment s",
    "profiles s",
    "probe sweep s",
    "decisions (accepted)",
    "decisions s",
    "slowest decision s",
    "checkpoints s",
    "held-out s",
    "oracle s",
    "learner process s (CPU s)",
    "learner peak RSS MiB",
    "sweep cells",
    "decision evaluations spent / naive",
    "cells the replay answered",
]


def table(results: Sequence[dict[str, Any]]) -> str:
    """The Markdown table: one row per (size, replay runner)."""
    lines = ["| " + " | ".join(HEAD) + " |", "| --- | --- |" + " ---: |" * (len(HEAD) - 2)]
    return "\n".join([*lines, *(_row(r) for r in results)])


def memory_table(results: Sequence[dict[str, Any]]) -> str:
    """Resident MiB after each phase of each learner run (now / peak so far)."""
    phases = list(results[0]["learn"]["rss_mb"]) if results else []
    lines = ["| N | replay | " + " | ".join(phases) + " |", "| ---: | --- |" + " ---: |" * len(phases)]
    for r in results:
        L = r["learn"]
        cells = [
            f"{now:,.0f} / {peak:,.0f}" if now is not None else f"- / {peak:,.0f}"
            for now, peak in (L["rss_mb"][p] for p in phases)
        ]
        lines.append(
            f"| {r['n']:,} | {'Ray actor' if L['ray'] else 'in-process'} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def before_after(before: dict[str, Any], after: Sequence[dict[str, Any]]) -> str:
    """CPU seconds per phase, the process's CPU and wall seconds and peak RSS, before -> after."""
    keys = ["environment", "prepare", "probe", "decisions", "checkpoints", "held_out", "oracle"]
    old = {(r["n"], r["learn"]["ray"]): r["learn"] for r in before["results"]}
    head = [f"{k} CPU s" for k in keys] + ["learner process CPU s", "its wall s", "peak RSS MiB"]
    lines = ["| N | replay | " + " | ".join(head) + " |", "| ---: | --- |" + " ---: |" * len(head)]
    for r in after:
        a, b = r["learn"], old.get((r["n"], r["learn"]["ray"]))
        if b is None:
            continue
        pairs = [(b["cpu_seconds"][k], a["cpu_seconds"][k]) for k in keys]
        pairs += [
            (b["process_cpu_seconds"], a["process_cpu_seconds"]),
            (b["process_seconds"], a["process_seconds"]),
        ]
        cells = [f"{x:.1f} -> {y:.1f}" for x, y in pairs] + [f"{_peak(b)} -> {_peak(a)}"]
        lines.append(
            f"| {r['n']:,} | {'Ray actor' if a['ray'] else 'in-process'} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def _peak(learn: dict[str, Any]) -> str:
    """Peak RSS of a learner run: the driver's, plus the replay actor's for a Ray run."""
    actor = learn["ray_memory"]
    return f"{learn['peak_rss_mb']:,.0f}" + (f" + actor {actor['actor_peak_rss_mb']:,.0f}" if actor else "")


def same_results(before: dict[str, Any], after: Sequence[dict[str, Any]]) -> bool:
    """Whether every run's learned tree, decisions, evaluations, held-out geomeans and oracle are equal."""
    keys = ("learned_tree", "decisions", "accepted", "evaluations", "env", "held_out_geomean", "oracle")
    old = {(r["n"], r["learn"]["ray"]): r["learn"] for r in before["results"]}
    pairs = [
        (old[(r["n"], r["learn"]["ray"])], r["learn"]) for r in after if (r["n"], r["learn"]["ray"]) in old
    ]
    return bool(pairs) and all(a[k] == b[k] for a, b in pairs for k in keys)


INTRO = """\
# The learner over resampled replay tables of {sizes} tasks (2 CPU cores)

`{command}`

On a 2-core machine that other jobs share, wall times can move by up to 2x between runs; CPU seconds
move much less, peak memory by a few MiB, and the counts not at all.

**The tasks are resampled, not new.** Each is a copy of one of the {originals} tasks the main job
replays (`workflows/train.yaml`'s recordings: every ncu group and every rule action recorded; until
2026-12-05 the 32 suite tasks of `datasets/h200_suite` alone), drawn with replacement (seed {seed}): id
`resampled/<original id>/<k>`, origin `resampled_from=<original id>`, source the original's plus the
comment `# resampled copy k of <original id>`; its profile and reward rows are the original's under the
copy's hash and recomputed keys, every recorded reward time (`ref_ms`, `new_ms`) multiplied by
`exp({jitter} z)` with z standard normal per row (speedup and reward recomputed), profiles unchanged.
They are written with the project's table writers to a temporary folder and read by `ReplayEnvironment`.

**What this does and does not measure.** The copies are pseudo-replicates: at N = {largest:,} each
original appears about {copies:.0f} times, so a paired test counts one task's gain that many times over,
its n and confidence bounds are inflated, and the accept/reject counts below are **not** evidence about
learning (nor are the held-out geomeans in the JSON: held-out copies are copies of training tasks). The
tables are about cost: time, memory and evaluations as the table grows.

Each run is `workflows/train.py environment=replay`'s pipeline through the library API: train.yaml's
`test_fraction` and `learn` settings (at most 12 decisions), the probes `[algorithm, memory, latency,
compute]`, `trees/seed.json`, the rule rewriter, the statistical proposer, checkpoints after every
decision, then the held-out comparison of 9 policies and the oracle analysis (train.py's report is not
built). Each step runs in its own process. Columns: *profiles* is `Learner._prepare` (every group of
every training task, read from the recording); *decisions* the `Learner.decide` calls (the first one
imports scipy, about 1 s); *checkpoints* writing `tree.json`, `proposals.jsonl` and `state.json` (the
whole memo) after each; *sweep cells* the probe sweep's cells; *spent / naive* the learner's count of
cells compared over its decisions (the affected acceptance tasks) against re-evaluating every training
task for every candidate tree; *cells the replay answered* the distinct (task, action) cells the
environment sent to its replay worker (every configuration row is derived from those). *learner process*
includes interpreter start and imports (its CPU seconds include the Ray processes it reaped); peak RSS is
`ru_maxrss` (a Ray row adds the replay actor's `VmHWM`). Per-phase wall and CPU seconds, and the Ray
session's processes, are in the JSON.
"""


def scaling(results: Sequence[dict[str, Any]]) -> str:
    """How CPU time and peak memory grow with N (in-process runs): per-task slopes and the growth ratio."""
    runs = sorted((r for r in results if not r["learn"]["ray"]), key=lambda r: r["n"])
    if len(runs) < 2:
        return "One size only: no slope."
    top = ("environment", "select", "fit", "held_out", "oracle")  # the phases, not their parts
    lines, excess = [], []  # excess: growth of CPU seconds over growth of N, per step
    for a, b in zip(runs, runs[1:], strict=False):
        la, lb = a["learn"], b["learn"]
        cpu_a, cpu_b = (sum(run["cpu_seconds"][k] for k in top) for run in (la, lb))
        excess.append((cpu_b / cpu_a) / (b["n"] / a["n"]))
        rss_a, rss_b = la["peak_rss_mb"], lb["peak_rss_mb"]
        added = b["n"] - a["n"]
        lines.append(
            f"- N {a['n']:,} -> {b['n']:,} ({b['n'] / a['n']:.1f}x tasks): CPU seconds of the phases "
            f"{cpu_a:.1f} -> {cpu_b:.1f} ({cpu_b / cpu_a:.1f}x, {1000 * (cpu_b - cpu_a) / added:.1f} ms "
            f"per added task); peak RSS {rss_a:,.0f} -> {rss_b:,.0f} MiB ({(rss_b - rss_a) / added:.2f} "
            f"MiB per added task); decision evaluations spent {la['evaluations']['spent']:,} -> "
            f"{lb['evaluations']['spent']:,}, naive {la['evaluations']['naive']:,} -> "
            f"{lb['evaluations']['naive']:,}."
        )
    verdict = (
        "CPU time grows no faster than N (no quadratic loop): the phases cost about the same per task at "
        "every size."
        if max(excess) <= 1.15
        else f"CPU time grows **faster than N** (up to {max(excess):.2f}x the growth of N in one step)."
    )
    lines.append(
        f"\n{verdict} Memory is the recording held in memory: the environment phase is the "
        "tables read (mostly the per-kernel metrics in the profile rows' JSON), the learner then adds "
        "the parsed profiles and reward rows of the training tasks, the held-out comparison those of "
        "the test tasks, and the oracle analysis's bootstrap a transient (see the table below)."
    )
    return "\n".join(lines)


def markdown(
    results: Sequence[dict[str, Any]],
    command: str,
    seed: int,
    jitter: float,
    before: dict[str, Any] | None = None,
    library: str = "",
) -> str:
    """The results page: what was run and what it is not, the cost table, memory per phase, before/after.

    ``library``: the commit the results were measured with (named in the before/after section).
    """
    sizes = sorted({r["n"] for r in results})
    largest = max(sizes) if sizes else 0
    # results measured before 2026-12-05 resampled the 32 suite tasks of datasets/h200_suite alone
    originals = results[0]["resample"].get("originals", 32) if results else 0
    intro = INTRO.format(
        sizes=", ".join(f"{n:,}" for n in sizes),
        command=command,
        originals=originals,
        seed=seed,
        jitter=jitter,
        largest=largest,
        copies=largest / max(originals, 1),
    )
    parts = [
        intro.strip(),
        "## Scaling",
        scaling(results),
        table(results),
        "## Resident memory after each phase (MiB now / peak so far)",
        memory_table(results),
    ]
    if before is not None:
        same = same_results(before, results)
        parts += [
            "## Before and after the library changes",
            f"Before: `bench/results/learner_scale_before.json`, this script run with the library of "
            f"`{before.get('library') or 'the parent commit'}` first on the import path (`PYTHONPATH` "
            f"pointing at a checkout of it) just before the run above, which used `{library or 'this'}` "
            f"(`git show {library.split('+')[0] or 'HEAD'}` lists the changes). "
            "CPU seconds are this process's; wall seconds shift with the other jobs on the machine. "
            "Learned trees, decisions, evaluation counts, held-out geomeans and oracle numbers "
            f"{'are identical' if same else '**differ**'} between the two.",
            before_after(before, results),
        ]
    return "\n\n".join(parts) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="resampled task counts")
    ap.add_argument(
        "--ray-sizes",
        type=int,
        nargs="*",
        default=[max(SIZES)],
        help="sizes also run through a Ray replay actor (none: --ray-sizes alone)",
    )
    ap.add_argument("--seed", type=int, default=0, help="resampling and jitter seed")
    ap.add_argument("--jitter", type=float, default=0.02, help="sigma of the log-normal factor on times")
    ap.add_argument("--keep", default=None, help="a folder to keep the recordings and runs in")
    ap.add_argument(
        "--out", default=str(ROOT / "bench" / "results" / "learner_scale"), help="writes OUT.md and OUT.json"
    )
    ap.add_argument(
        "--before",
        default=None,
        help="the JSON of this script run on an earlier library, for a before/after table",
    )
    ap.add_argument(
        "--render", action="store_true", help="rewrite OUT.md from OUT.json without running anything"
    )
    ap.add_argument("--step", choices=("resample", "learn", "learn-ray"), help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.step:
        logging.getLogger("autoprofiler.profiling").setLevel(logging.ERROR)  # kernel-list notes, per task
        Path(args.result).write_text(json.dumps(_step(args), indent=1) + "\n")
        return 0
    if any(n < 1 for n in [*args.sizes, *args.ray_sizes]) or args.jitter < 0:
        ap.error(f"expected sizes >= 1 and --jitter >= 0, got {args.sizes}, {args.ray_sizes}, {args.jitter}")
    before = _read_json(ap, "--before", args.before) if args.before else None
    out = Path(args.out)
    if args.render:  # the page again from the saved numbers (the text changed, not the measurement)
        record = _read_json(ap, "--render", str(out.with_suffix(".json")))
    else:
        given = list(sys.argv[1:] if argv is None else argv)
        record = {
            "command": " ".join(["python bench/learner_scale.py", *given]),
            "seed": args.seed,
            "jitter": args.jitter,
            "library": _git_sha(),
            "results": run_sizes(args.sizes, args.ray_sizes, args.seed, args.jitter, args.keep),
        }
        out.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    text = markdown(
        record["results"], record["command"], record["seed"], record["jitter"], before, record["library"]
    )
    print(text)
    out.with_suffix(".md").write_text(text)
    print(f"wrote {out.with_suffix('.md')}" + ("" if args.render else " and .json"))
    return 0


def run_sizes(
    sizes: Sequence[int], ray_sizes: Sequence[int], seed: int, jitter: float, keep: str | None
) -> list[dict[str, Any]]:
    """Every size: its recording written in one child process, each learner run in another."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(keep) if keep else Path(tmp)
        for n in sorted(set(sizes) | set(ray_sizes)):
            work = base / f"n{n}"
            resample = _child("resample", n, work, seed, jitter)
            steps = (["learn"] if n in sizes else []) + (["learn-ray"] if n in ray_sizes else [])
            for step in steps:
                results.append({"n": n, "resample": resample, "learn": _child(step, n, work, seed, jitter)})
                print(_row(results[-1]), flush=True)
    return results


def _read_json(ap: argparse.ArgumentParser, flag: str, path: str) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        ap.error(f"{flag}: cannot read {path}: {exc}")


def _git_sha() -> str:
    """The commit (and ``+dirty``) of the library this run used."""
    from autoprofiler.provenance import git_state

    sha, dirty = git_state()
    return f"{sha}{'+dirty' if dirty else ''}"


if __name__ == "__main__":
    sys.exit(main())
