"""What the workflow scripts share: one resolved config per run, the runtime, and the run's record.

- ``load_config(yaml_path, argv)``: the YAML beside the script gives defaults and types; ``--config
  FILE`` and ``key=value`` overrides (dotted for nested sections) come on top; every unknown key, wrong
  type and bad value is collected and reported at once (``ConfigError``), before any work starts.
- ``make_runner(cfg)``: the runtime section decides where cells run: Ray (``GpuWorker`` actors; local
  Ray on a laptop, the cluster under ``ray job submit``) or this process.
- ``save_config(out, cfg)``: the resolved config and the run's provenance (code, torch, Ray, host),
  written next to the outputs.

Library code: scripts print; this module raises and logs.
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = ["ConfigError", "load_config", "make_runner", "save_config", "RUNTIME_DEFAULTS"]

#: The ``runtime`` section every workflow config has.
RUNTIME_DEFAULTS = {"ray": True, "workers": None, "concurrency": 1}


class ConfigError(ValueError):
    """Every problem found in a config, one per line."""

    def __init__(self, problems: Sequence[str]):
        super().__init__("invalid config:\n  - " + "\n  - ".join(problems))
        self.problems = list(problems)


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
    args = parser.parse_args(list(argv))
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
        return LocalDriver(CellWorker(spec, rewriter=rewriter), progress=20)
    from autoprofiler.runtime.ray_driver import RayDriver, init_ray

    init_ray()
    if recording is not None:
        return RayDriver.start_replay(str(recording), source, num_workers=runtime.get("workers") or 1)
    return RayDriver.start(spec, num_workers=runtime.get("workers"))


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
