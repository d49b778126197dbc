"""What the workflow scripts share: one resolved config per run, the runtime, and the run's record.

- ``load_config(yaml_path, argv)``: the YAML beside the script gives defaults and types; ``--config
  FILE`` and ``key=value`` overrides (dotted for nested sections) come on top; every unknown key, wrong
  type, bad value and stray ``--option`` is collected and reported at once (``ConfigError``), before any
  work starts.
- ``resolve_path``: a relative path in a config means the current folder's, else the repository's;
  ``tables`` and ``tasks`` take a path or a list of paths (``load_config(..., paths=...)``; the tasks
  and recordings they name are read by ``workflow_sources``).
- ``out_dir_problems`` / ``prepare_out_dir``: a run folder is never reused by accident. A non-empty
  ``out_dir`` is refused unless ``--resume`` (continue it) or ``--overwrite`` (replace it: only a folder a
  workflow wrote, one holding ``config.json``); so every output in it, the report included, describes
  the one run it belongs to.
- ``select_tasks`` / ``task_problems`` (from ``workflow_sources``): the tasks a config names (one or
  more sources merged by id, id filters, a cap), and what is wrong with them, checked with the rest.
- ``environment_problem`` and ``make_runner(cfg)``: the runtime section decides where cells run: Ray
  (``GpuWorker`` actors; local Ray on a laptop, the cluster under ``ray job submit``) or this process. A
  machine that cannot run it (no CUDA, no ncu, no Ray, Ray does not start, too few GPUs) raises
  ``EnvironmentProblem`` naming the fix (scripts exit 3); what can be checked before Ray starts is.
- ``save_config(out, cfg)``: the resolved config and the run's provenance (code, torch, Ray, host),
  written next to the outputs; ``config_line`` is the one line a script prints about it.
- ``run_main(main, argv)``: a script's exit codes: 2 with one line per problem for a ``ConfigError``, 3
  with the fix for an ``EnvironmentProblem`` (or a profiler's no-ncu / counters-not-permitted error).

Library code: scripts print (``run_main`` prints for them); the rest of this module raises and logs.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import socket
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from autoprofiler.workflow_sources import (
    REPO,
    checked_tasks,
    path_spec_problem,
    resolve_path,
    select_tasks,
    task_problems,
)

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_ENVIRONMENT",
    "REPO",
    "RUNTIME_DEFAULTS",
    "ConfigError",
    "checked_tasks",
    "EnvironmentProblem",
    "config_line",
    "CONFIG_REWRITERS",
    "config_rewriter",
    "configure_logging",
    "environment_problem",
    "load_config",
    "make_runner",
    "out_dir_problems",
    "prepare_out_dir",
    "resolve_path",
    "run_main",
    "save_config",
    "select_tasks",
    "task_problems",
    "worker_problems",
    "worker_spec",
]

logger = logging.getLogger(__name__)

#: The ``runtime`` section every workflow config has.
RUNTIME_DEFAULTS = {"ray": True, "workers": None, "concurrency": 1}
EXIT_BAD_INPUT, EXIT_ENVIRONMENT = 2, 3
#: Command-line flags every workflow takes; anything else is ``key=value``.
_FLAGS = {"--config": True, "--resume": False, "--overwrite": False, "-h": False, "--help": False}


class ConfigError(ValueError):
    """Every problem found in a config, one per line."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("invalid config:\n  - " + "\n  - ".join(problems))
        self.problems = list(problems)


class EnvironmentProblem(RuntimeError):
    """This machine cannot run the config as given (no CUDA, no Ray, too few GPUs); says the fix."""


def configure_logging(
    quiet: Sequence[str] = ("autoprofiler.profiling", "autoprofiler.evaluation", "autoprofiler.tasks"),
) -> None:
    """A script's logging: INFO lines with time and logger name on stderr; the ``quiet`` loggers (one line
    per profiled or evaluated program, per folder of tasks loaded) from WARNING only. Ray Data logs four
    INFO lines per Parquet part it writes (and a "no available CPUs" warning whenever the workers hold
    every CPU, which is how our actors run): from ERROR only."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("RAY_DATA_DISABLE_PROGRESS_BARS", "1")
    try:  # Ray Data sets its loggers up when it is imported; set their level after that
        import ray.data  # noqa: F401
    except ImportError:
        return
    for name in ("ray.data", "ray.data._internal"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _split_flags(argv: Sequence[str], schema: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(argv without stray ``--options``, one problem per stray option): ``--filter relu`` is not how a
    workflow takes a key, so say how it does (``filter='[relu]'``)."""
    kept, problems = [], []
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        name, eq, value = item.partition("=")
        if not item.startswith("-") or name in _FLAGS or _is_number(item):
            kept.append(item)
            if name in _FLAGS and _FLAGS[name] and not eq and i + 1 < len(items):
                kept.append(items[i + 1])  # --config FILE
                i += 1
            i += 1
            continue
        key = name.lstrip("-").replace("-", "_")
        if not eq and i + 1 < len(items) and not items[i + 1].startswith("-") and "=" not in items[i + 1]:
            value, i = items[i + 1], i + 1  # --filter nope: the value goes with the option
        i += 1
        if key in schema:
            shown = (
                f"[{value}]"
                if isinstance(schema[key], list) and value and not value.startswith("[")
                else value
            )
            example = f"{key}={shown!r}" if shown else f"{key}=<value>"
            problems.append(f"{name}: not an option; workflows take key=value overrides, e.g. {example}")
        else:
            problems.append(
                f"{name}: unknown option{_did_you_mean(key, schema)} (options: --config FILE, --resume, "
                f"--overwrite; settings are key=value with keys {', '.join(schema)})"
            )
    return kept, problems


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


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
    paths: Sequence[str] = (),
    claim: bool = False,
) -> dict[str, Any]:
    """File defaults, then ``--config FILE``, then ``key=value`` overrides; all checked at once.

    Args:
        yaml_path: the shipped config; its keys and value types are the schema.
        argv: the command line (``--config FILE``, ``--resume``, ``key=value`` ...).
        nested: sections that take dotted overrides (``learn.confidence=0.9``); their keys are checked
            against the shipped section when it has any, else left to their consumer.
        checks: more checks on the resolved config (which may still hold values of a wrong type, already
            reported); returns problems (strings).
        paths: keys that take a path or a non-empty list of paths (``tables``, ``tasks``) whatever type
            their shipped value has.
        claim: also refuse an ``out_dir`` that holds another run, unless ``--resume`` or
            ``--overwrite`` (``out_dir_problems``).

    Raises:
        ConfigError: every problem, one per line.
    """
    schema = yaml.safe_load(Path(yaml_path).read_text())
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", default=None, help=f"a YAML config (keys as in {Path(yaml_path).name})")
    parser.add_argument("--resume", action="store_true", help="continue the run already in out_dir")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace the run already in out_dir (deletes it first)"
    )
    parser.add_argument("overrides", nargs="*", help="key=value (YAML values; dots for nested keys)")
    kept, problems = _split_flags(argv, schema)
    args = parser.parse_intermixed_args(kept)
    cfg = json.loads(json.dumps(schema))
    if args.config:
        try:
            given = yaml.safe_load(Path(args.config).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError([f"--config {args.config}: {exc}"]) from None
        for key, value in given.items():
            if key not in schema:
                problems.append(f"{args.config}: unknown key {key!r}{_did_you_mean(key, schema)}")
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
            problems.append(
                f"override {key!r}: unknown key{_did_you_mean(head, schema)} (known: {', '.join(schema)})"
            )
        elif rest:
            if head not in nested:
                problems.append(f"override {key!r}: {head!r} is not a nested section")
                continue
            known = schema[head] or {}
            if known and rest not in known:
                problems.append(
                    f"override {key!r}: unknown key {rest!r} in {head}{_did_you_mean(rest, known)} "
                    f"(known: {', '.join(known)})"
                )
                continue
            cfg[head] = {**(cfg[head] or {}), rest: value}
        else:
            cfg[head] = value
    for key, value in cfg.items():
        if key in paths:
            problem = path_spec_problem(key, value)
            if problem:
                problems.append(problem)
        elif not _type_ok(schema[key], value):
            problems.append(
                f"{key}: expected {type(schema[key]).__name__}, got {value!r} ({type(value).__name__})"
            )
        elif key in nested and isinstance(value, dict) and isinstance(schema[key], dict):
            for sub, v in value.items():
                if sub in schema[key] and not _type_ok(schema[key][sub], v):
                    expected = type(schema[key][sub]).__name__
                    problems.append(f"{key}.{sub}: expected {expected}, got {v!r} ({type(v).__name__})")
    if "runtime" in cfg:
        problems += _runtime_problems(cfg["runtime"] if isinstance(cfg["runtime"], dict) else {})
    cfg["resume"] = bool(cfg.get("resume") is True or args.resume)
    cfg["overwrite"] = bool(cfg.get("overwrite") is True or args.overwrite)
    if cfg["resume"] and cfg["overwrite"]:
        problems.append("resume and overwrite: pass one of them (continue the run in out_dir, or replace it)")
    if checks is not None:  # value checks see a config whose types may be wrong: they guard themselves
        problems += checks(cfg)
    if claim:
        problems += out_dir_problems(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def out_dir_problems(cfg: dict[str, Any], key: str = "out_dir") -> list[str]:
    """What stops a run from writing into ``cfg[key]``: a file there, or a folder already holding
    something when neither ``resume`` nor ``overwrite`` is set; ``overwrite`` only replaces a folder a
    workflow wrote (it holds ``config.json``) and never the current folder or one above it."""
    spec = cfg.get(key)
    if not isinstance(spec, str) or not spec:
        return []
    out = Path(spec)
    if not out.exists():
        return []
    if not out.is_dir():
        return [f"{key}: {spec!r} exists and is not a folder"]
    held = sorted(p.name for p in out.iterdir())
    if not held or cfg.get("resume"):
        return []
    if cfg.get("overwrite"):
        if Path.cwd().resolve().is_relative_to(out.resolve()) or out.resolve() == REPO:
            return [f"{key}: {spec!r} holds the current folder or the repository; it is never replaced"]
        if not (out / "config.json").exists():
            return [
                f"{key}: {spec!r} holds files but no config.json (not a run folder), so --overwrite does "
                "not delete it; pick another out_dir"
            ]
        return []
    shown = ", ".join(held[:4]) + (f", ... ({len(held)} entries)" if len(held) > 4 else "")
    return [
        f"{key}: {spec!r} already holds a run ({shown}); pass --resume to continue it, --overwrite to "
        f"replace it, or {key}=<a new folder>"
    ]


def prepare_out_dir(cfg: dict[str, Any], key: str = "out_dir") -> Path:
    """The run folder, created; with ``overwrite`` (checked by ``out_dir_problems``), emptied first."""
    out = Path(cfg[key])
    if cfg.get("overwrite") and out.is_dir() and (out / "config.json").exists():
        shutil.rmtree(out)
        logger.info("--overwrite: removed the previous run in %s", out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _runtime_problems(runtime: dict[str, Any]) -> list[str]:
    problems = []
    workers = runtime.get("workers")
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        problems.append(f"runtime.workers: expected null (one per GPU) or an integer >= 1, got {workers!r}")
    concurrency = runtime.get("concurrency", 1)
    if not isinstance(concurrency, int) or concurrency < 1:
        problems.append(f"runtime.concurrency: expected an integer >= 1, got {concurrency!r}")
    return problems


#: Show a progress bar for runner calls of at least this many cells (the learner's decisions ask for a
#: handful at a time, each a sandboxed evaluation of seconds).
PROGRESS_FROM = 2


def _joins_cluster(runtime: dict[str, Any]) -> bool:
    """Whether the workers run on a Ray cluster this script joins (``ray job submit`` sets RAY_ADDRESS):
    then this machine's CUDA and ncu say nothing about theirs."""
    return bool(runtime.get("ray", True)) and bool(os.environ.get("RAY_ADDRESS"))


def environment_problem(device: str, source: str, runtime: dict[str, Any]) -> str | None:
    """Why this machine cannot run live workers of ``device`` and ``source`` (None: it can, as far as can
    be told before starting anything): no CUDA device, no ``ncu`` on PATH, Ray not importable."""
    if runtime.get("ray", True):
        try:
            import ray  # noqa: F401
        except ImportError as exc:
            return (
                f"runtime.ray=true but Ray does not import here ({exc}); pip install 'ray[default,data]', "
                "or set runtime.ray=false to run in this process"
            )
    if _joins_cluster(runtime):
        return None
    if isinstance(device, str) and device.startswith("cuda") and not _cuda_here():
        return (
            f"device={device}: torch sees no CUDA device on this machine; run on a GPU machine (or "
            "submit to a GPU cluster: docs/cluster.md), or set device=cpu task_size=small"
        )
    if source == "ncu" and shutil.which("ncu") is None:
        return (
            "source=ncu: the Nsight Compute executable ncu is not on PATH here; install Nsight Compute "
            "(or add its bin/ folder to PATH), or set source=torch"
        )
    return None


def _start_ray() -> None:
    try:
        from autoprofiler.runtime.ray_driver import init_ray

        init_ray()
    except ImportError as exc:
        raise EnvironmentProblem(
            f"runtime.ray=true but Ray does not import here ({exc}); pip install 'ray[default,data]', "
            "or set runtime.ray=false to run in this process"
        ) from None
    except Exception as exc:  # a cluster that does not answer, a local start that fails
        where = (
            f"the cluster at RAY_ADDRESS={os.environ['RAY_ADDRESS']}"
            if os.environ.get("RAY_ADDRESS")
            else "a local Ray"
        )
        raise EnvironmentProblem(
            f"Ray did not start ({where}): {type(exc).__name__}: {' '.join(str(exc).split())[:300]}; "
            "check `ray status`, or set runtime.ray=false to run in this process"
        ) from None


def make_runner(
    runtime: dict[str, Any],
    spec: Any = None,
    recording: str | Path | Sequence[str | Path] | None = None,
    source: str | None = None,
    rewriter: Any = None,
):
    """The runner a workflow's environment uses.

    ``runtime.ray``: start (or join, under ``ray job submit``) Ray and run ``runtime.workers`` actors:
    ``GpuWorker`` actors built from ``spec`` (one per GPU by default), or ``ReplayWorker`` actors over
    ``recording`` (a folder, or several replayed together). Without Ray: one worker in this process.
    ``None`` for a replay without Ray (the environment's own in-process replay worker). Calls of
    ``PROGRESS_FROM`` cells or more show a bar.

    Raises:
        EnvironmentProblem: the machine (or cluster) cannot run it; the message says the fix.
    """
    from autoprofiler.runtime import CellWorker, LocalDriver

    if spec is not None:
        problem = environment_problem(spec.device, spec.source, runtime)
        if problem:
            raise EnvironmentProblem(problem)
    if not runtime.get("ray", True):
        if recording is not None:
            return None
        concurrency = runtime.get("concurrency", 1)
        return LocalDriver(
            CellWorker(spec, rewriter=rewriter), progress=PROGRESS_FROM, concurrency=concurrency
        )
    _start_ray()
    from autoprofiler.runtime.ray_driver import RayDriver

    if recording is not None:
        from autoprofiler.tables import recording_folders

        folders = [str(f) for f in recording_folders(recording)]
        return RayDriver.start_replay(
            folders, source, num_workers=runtime.get("workers") or 1, progress=PROGRESS_FROM
        )
    try:
        return RayDriver.start(spec, num_workers=runtime.get("workers"), progress=PROGRESS_FROM)
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


#: Rewriters a workflow config builds (``config_rewriter``). ``workflows/train.py`` also takes
#: ``experience``, which it fits on a replay's training tasks once the split is known.
CONFIG_REWRITERS = ("rule", "playbook", "openai")


def config_rewriter(cfg: dict[str, Any], llm_cache: Path | None = None):
    """The rewriter a config names: ``rewriter`` (one of ``CONFIG_REWRITERS``) with ``rewriter_options``; an
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
    from autoprofiler.rewriters.playbook import PlaybookRewriter

    problems = []
    if cfg.get("source", "torch") not in ("ncu", "torch"):
        problems.append(f"source: expected ncu or torch, got {cfg.get('source')!r}")
    if isinstance(cfg.get("eval"), dict):
        try:
            EvalConfig(device=cfg.get("device"), task_size=cfg.get("task_size"), **cfg["eval"])
        except (TypeError, ValueError) as exc:
            problems.append(f"device, task_size, eval: {' '.join(str(exc).split())}")
    options = cfg.get("rewriter_options")
    offline = {"rule": RuleRewriter, "playbook": PlaybookRewriter}.get(cfg.get("rewriter", "rule"))
    if offline is not None and isinstance(options, dict):
        try:
            offline(**options)
        except (TypeError, ValueError) as exc:
            problems.append(f"rewriter_options: {' '.join(str(exc).split())}")
    return problems


def _cuda_here() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def probe_problems(probe: Sequence[str], source: str) -> list[str]:
    """``probe``: names of fixed configurations (``profiling.CONFIGURATIONS``) whose groups all belong
    to ``source``; one line naming the others, with the ones that do."""
    from autoprofiler.profiling import CONFIGURATIONS, GROUPS

    mine = [n for n, groups in CONFIGURATIONS.items() if all(GROUPS[g].source == source for g in groups)]
    unknown = [p for p in probe if p not in mine]
    if unknown:
        return [f"probe: {unknown} are not {source} configurations (known: {', '.join(mine)})"]
    return []


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


def _short(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]" if len(value) <= 4 else f"[{len(value)} items]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value)


def config_line(path: Path, cfg: dict[str, Any], keys: Sequence[str]) -> str:
    """One line about a run's config: where the whole of it is, and the few ``keys`` that say what runs.

    >>> config_line(Path("runs/x/config.json"), {"device": "cpu", "filter": ["relu"]}, ["device", "filter"])
    'config: runs/x/config.json (device=cpu filter=[relu])'
    """
    shown = " ".join(f"{k}={_short(cfg[k])}" for k in keys if k in cfg)
    return f"config: {path} ({shown})"


def run_main(main: Callable[[list[str]], int], argv: Sequence[str] | None = None) -> int:
    """Run a workflow's ``main(argv)`` and turn the problems it raises into exit codes, printing one
    line each on stderr (this is the scripts' printing, kept in one place): ``ConfigError`` exits 2 (every
    problem on its own line), ``EnvironmentProblem`` and the profiler's ``NcuNotFound`` /
    ``CountersNotPermitted`` exit 3 (the message says the fix), a replay asked for a cell its recording
    lacks (``MissingOutcome``) exits 2; what was checkpointed before stays for ``--resume``."""
    from autoprofiler.environments import MissingOutcome
    from autoprofiler.profiling import CountersNotPermitted, NcuNotFound

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return main(argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (EnvironmentProblem, NcuNotFound, CountersNotPermitted) as exc:
        print(f"error: {_root_message(exc)}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    except MissingOutcome as exc:
        print(
            f"error: {_root_message(exc)}; the replay answers only what was recorded: record that action "
            "first (e.g. bench/h200_record_playbook.sh for the playbook's actions) or run environment=live",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT


def _root_message(exc: BaseException) -> str:
    """The message of ``exc`` on one line; raised in a Ray actor (``RayTaskError``, which Ray makes an
    instance of the cause's class too), the cause's own message without the remote traceback."""
    ray = sys.modules.get("ray")
    if ray is not None:
        from ray.exceptions import RayTaskError

        if isinstance(exc, RayTaskError) and exc.cause is not None:
            exc = exc.cause
    return " ".join(str(exc).split())
