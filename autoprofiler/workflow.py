"""What the workflow scripts share: one resolved config per run, the runtime, and the run's record.

- ``load_config(yaml_path, argv)``: the YAML beside the script gives defaults and types; ``--config
  FILE`` and ``key=value`` overrides (dotted for nested sections) come on top; every unknown key, wrong
  type and bad value is collected and reported at once (``ConfigError``), before any work starts.
- ``select_tasks`` / ``task_problems``: the tasks a config names (a path, id filters, a cap), and what is
  wrong with them, checked with the rest of the config.
- ``make_runner(cfg)``: the runtime section decides where cells run: Ray (``GpuWorker`` actors; local
  Ray on a laptop, the cluster under ``ray job submit``) or this process. A machine that cannot run it
  (no CUDA, no Ray, too few GPUs) raises ``EnvironmentProblem`` naming the fix (scripts exit 3).
- ``save_config(out, cfg)``: the resolved config and the run's provenance (code, torch, Ray, host),
  written next to the outputs.

Library code: scripts print; this module raises and logs.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "RUNTIME_DEFAULTS",
    "ConfigError",
    "EnvironmentProblem",
    "config_rewriter",
    "configure_logging",
    "load_config",
    "make_runner",
    "save_config",
    "select_tasks",
    "task_problems",
    "worker_problems",
    "worker_spec",
]

#: The ``runtime`` section every workflow config has.
RUNTIME_DEFAULTS = {"ray": True, "workers": None, "concurrency": 1}


class ConfigError(ValueError):
    """Every problem found in a config, one per line."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("invalid config:\n  - " + "\n  - ".join(problems))
        self.problems = list(problems)


class EnvironmentProblem(RuntimeError):
    """This machine cannot run the config as given (no CUDA, no Ray, too few GPUs); says the fix."""


def configure_logging(quiet: Sequence[str] = ("autoprofiler.profiling", "autoprofiler.evaluation")) -> None:
    """A script's logging: INFO lines with time and logger name on stderr; the ``quiet`` loggers (one line
    per profiled or evaluated program) from WARNING only."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)


def _type_ok(default: Any, value: Any) -> bool:
    if default is None or value is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int | float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, type(default))


def load_config(
    yaml_path: str | Path,
    argv: Sequence[str],
    nested: Sequence[str] = (),
    checks: Callable[[dict[str, Any]], list[str]] | None = None,
    description: str = "",
) -> dict[str, Any]:
    """File defaults, then ``--config FILE``, then ``key=value`` overrides; all checked at once.

    Args:
        yaml_path: the shipped config; its keys and value types are the schema.
        argv: the command line (``--config FILE``, ``--resume``, ``key=value`` ...).
        nested: sections that take dotted overrides (``learn.confidence=0.9``); their keys are checked
            against the shipped section when it has any, else left to their consumer.
        checks: more checks on the resolved config (which may still hold values of a wrong type, already
            reported); returns problems (strings).

    Raises:
        ConfigError: every problem, one per line.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", default=None, help=f"a YAML config (keys as in {Path(yaml_path).name})")
    parser.add_argument("--resume", action="store_true", help="continue from out_dir's last checkpoint")
    parser.add_argument("overrides", nargs="*", help="key=value (YAML values; dots for nested keys)")
    args = parser.parse_intermixed_args(list(argv))
    schema = yaml.safe_load(Path(yaml_path).read_text())
    cfg = json.loads(json.dumps(schema))
    problems: list[str] = []
    if args.config:
        try:
            given = yaml.safe_load(Path(args.config).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError([f"--config {args.config}: {exc}"]) from None
        for key, value in given.items():
            if key not in schema:
                problems.append(f"{args.config}: unknown key {key!r}")
            else:
                cfg[key] = value
    for item in args.overrides:
        if "=" not in item:
            problems.append(f"override {item!r}: expected key=value")
            continue
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else None
        except yaml.YAMLError:
            problems.append(f"override {key!r}: {raw!r} is not a YAML value")
            continue
        head, _, rest = key.partition(".")
        if head not in schema:
            problems.append(f"override {key!r}: unknown key (known: {', '.join(schema)})")
        elif rest:
            if head not in nested:
                problems.append(f"override {key!r}: {head!r} is not a nested section")
                continue
            known = schema[head] or {}
            if known and rest not in known:
                problems.append(
                    f"override {key!r}: unknown key {rest!r} in {head} (known: {', '.join(known)})"
                )
                continue
            cfg[head] = {**(cfg[head] or {}), rest: value}
        else:
            cfg[head] = value
    for key, value in cfg.items():
        if not _type_ok(schema[key], value):
            problems.append(
                f"{key}: expected {type(schema[key]).__name__}, got {value!r} ({type(value).__name__})"
            )
        elif key in nested and isinstance(value, dict) and isinstance(schema[key], dict):
            for sub, v in value.items():
                if sub in schema[key] and not _type_ok(schema[key][sub], v):
                    expected = type(schema[key][sub]).__name__
                    problems.append(f"{key}.{sub}: expected {expected}, got {v!r} ({type(v).__name__})")
    if "runtime" in cfg:
        problems += _runtime_problems(cfg["runtime"] or {})
    if checks is not None:  # value checks see a config whose types may be wrong: they guard themselves
        problems += checks(cfg)
    if problems:
        raise ConfigError(problems)
    cfg["resume"] = bool(cfg.get("resume") or args.resume)
    return cfg


def _runtime_problems(runtime: dict[str, Any]) -> list[str]:
    problems = []
    workers = runtime.get("workers")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        problems.append(f"runtime.workers: expected null (one per GPU) or an integer >= 1, got {workers!r}")
    concurrency = runtime.get("concurrency", 1)
    if not isinstance(concurrency, int) or concurrency < 1:
        problems.append(f"runtime.concurrency: expected an integer >= 1, got {concurrency!r}")
    return problems


def make_runner(
    runtime: dict[str, Any],
    spec: Any = None,
    recording: str | Path | None = None,
    source: str | None = None,
    rewriter: Any = None,
):
    """The runner a workflow's environment uses.

    ``runtime.ray``: start (or join, under ``ray job submit``) Ray and run ``runtime.workers`` actors:
    ``GpuWorker`` actors built from ``spec`` (one per GPU by default), or ``ReplayWorker`` actors over
    ``recording``. Without Ray: one worker in this process. ``None`` for a replay without Ray (the
    environment's own in-process replay worker).
    """
    from autoprofiler.runtime import CellWorker, LocalDriver

    if not runtime.get("ray", True):
        if recording is not None:
            return None
        if spec.device.startswith("cuda") and not _cuda_here():
            raise EnvironmentProblem(
                f"device={spec.device}: torch sees no CUDA device on this machine; run on a GPU machine, "
                "or set device=cpu task_size=small"
            )
        concurrency = runtime.get("concurrency", 1)
        return LocalDriver(CellWorker(spec, rewriter=rewriter), progress=20, concurrency=concurrency)
    try:
        from autoprofiler.runtime.ray_driver import RayDriver, init_ray

        init_ray()
    except ImportError as exc:
        raise EnvironmentProblem(
            f"runtime.ray=true but Ray does not import here ({exc}); pip install 'ray[default,data]', "
            "or set runtime.ray=false to run in this process"
        ) from None
    if recording is not None:
        return RayDriver.start_replay(str(recording), source, num_workers=runtime.get("workers") or 1)
    try:
        return RayDriver.start(spec, num_workers=runtime.get("workers"))
    except RuntimeError as exc:  # too few GPUs in the cluster for the CUDA workers asked for
        raise EnvironmentProblem(
            f"{exc}; add GPU workers to the cluster (docs/cluster.md), or set device=cpu task_size=small"
        ) from None


def worker_spec(cfg: dict[str, Any], **changes: Any):
    """The ``WorkerSpec`` of a config's live settings: ``device``, ``task_size``, ``source`` (default
    ``torch``), ``eval``, ``rewriter`` (default ``rule``), ``rewriter_options``, ``llm``,
    ``range_replay_above`` and ``runtime.concurrency``; ``changes`` override fields (another ``eval``)."""
    from autoprofiler.runtime import WorkerSpec

    llm = cfg.get("llm") or {}
    fields = {
        "device": cfg["device"],
        "task_size": cfg["task_size"],
        "source": cfg.get("source", "torch"),
        "eval": dict(cfg.get("eval") or {}),
        "rewriter": cfg.get("rewriter", "rule"),
        "rewriter_options": dict(cfg.get("rewriter_options") or {}),
        "llm": {k: v for k, v in llm.items() if k in ("base_url", "model")},
        "range_replay_above": cfg.get("range_replay_above"),
        "concurrency": (cfg.get("runtime") or {}).get("concurrency", 1),
    }
    return WorkerSpec(**{**fields, **changes})


def config_rewriter(cfg: dict[str, Any], llm_cache: Path | None = None):
    """The rewriter a config names: ``rewriter`` (``rule`` | ``openai``) with ``rewriter_options``; an
    ``openai`` rewriter gets a ``ChatClient`` from the ``llm`` section (its cache in ``llm_cache``
    when ``llm.cache`` is true)."""
    from autoprofiler.rewriters import make_rewriter

    options = dict(cfg.get("rewriter_options") or {})
    llm = cfg.get("llm") or {}
    if cfg.get("rewriter", "rule") == "openai":
        from autoprofiler.llm import ChatClient

        cache = str(llm_cache) if llm.get("cache") and llm_cache is not None else False
        options.setdefault(
            "client", ChatClient(base_url=llm.get("base_url"), model=llm.get("model"), cache=cache)
        )
    return make_rewriter(cfg.get("rewriter", "rule"), **options)


def worker_problems(cfg: dict[str, Any]) -> list[str]:
    """One line per problem with a config's live settings (``worker_spec``'s keys): source, device and
    task size, the ``eval`` fields (``EvalConfig``) and a rule rewriter's ``rewriter_options``."""
    from autoprofiler.evaluation import EvalConfig
    from autoprofiler.rewriters import RuleRewriter

    problems = []
    if cfg.get("source", "torch") not in ("ncu", "torch"):
        problems.append(f"source: expected ncu or torch, got {cfg.get('source')!r}")
    if isinstance(cfg.get("eval"), dict):
        try:
            EvalConfig(device=cfg.get("device"), task_size=cfg.get("task_size"), **cfg["eval"])
        except (TypeError, ValueError) as exc:
            problems.append(f"device, task_size, eval: {' '.join(str(exc).split())}")
    options = cfg.get("rewriter_options")
    if cfg.get("rewriter", "rule") == "rule" and isinstance(options, dict):
        try:
            RuleRewriter(**options)
        except (TypeError, ValueError) as exc:
            problems.append(f"rewriter_options: {' '.join(str(exc).split())}")
    return problems


def _cuda_here() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def select_tasks(
    spec: str | Path, names: Sequence[str] = (), max_tasks: int = 0
) -> tuple[list, Any, list[str]]:
    """The tasks ``spec`` holds (anything ``tasks.load_tasks`` reads), filtered and capped.

    ``names``: task ids or id suffixes (``relu``, ``l1/relu``, ``suite/l1/relu``), kept in the order
    of ``spec``; empty keeps every task. ``max_tasks`` > 0 keeps the first that many after the filter.
    Returns ``(tasks, load report, names that matched no task)``.

    Raises:
        tasks.TaskLoadError: ``spec`` does not exist or is not a task source.
    """
    from autoprofiler.tasks import load_tasks

    report = load_tasks(spec)
    wanted = [str(n) for n in names]

    def matches(task_id: str, name: str) -> bool:
        return task_id == name or task_id.endswith("/" + name)

    tasks = [t for t in report.tasks if not wanted or any(matches(t.id, n) for n in wanted)]
    unmatched = [n for n in wanted if not any(matches(t.id, n) for t in report.tasks)]
    return (tasks[:max_tasks] if max_tasks else tasks), report, unmatched


def task_problems(
    spec: Any, names: Any, max_tasks: Any, key: str = "tasks", filter_key: str = "filter"
) -> list[str]:
    """One line per problem with the tasks a config names: no such path, names matching no task, none left.

    Values of a wrong type (already reported by ``load_config``) are skipped.
    """
    from autoprofiler.tasks import TaskLoadError

    if not isinstance(spec, str | Path) or not isinstance(names, list) or not isinstance(max_tasks, int):
        return []
    try:
        tasks, report, unmatched = select_tasks(spec, names, max_tasks)
    except TaskLoadError as exc:
        return [f"{key}: {str(spec)!r} does not load: {' '.join(str(exc).split())}"]
    problems = [f"{filter_key}: {n!r} matches no task in {spec}" for n in unmatched]
    if not tasks and not unmatched:
        problems.append(f"{key}: {str(spec)!r} selects 0 tasks ({len(report.errors)} failed to load)")
    return problems


def run_provenance() -> dict[str, Any]:
    """Code, library versions and host of this run (saved beside its outputs)."""
    import importlib.metadata

    from autoprofiler.provenance import git_state

    sha, dirty = git_state()
    versions = {}
    for name in ("torch", "ray", "polars", "pyarrow"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "git_sha": sha,
        "git_dirty": dirty,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        **versions,
    }


def save_config(out: Path, cfg: dict[str, Any]) -> Path:
    """Write ``out/config.json``: the resolved config and the run's provenance."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.json"
    path.write_text(json.dumps({**cfg, "provenance": run_provenance()}, indent=2, default=str) + "\n")
    return path
