"""What a Serve deployment of the service is built from: one ``ServeSettings``, checked all at once.

``serve run serve_config.yaml`` hands the application's ``args`` to ``autoprofiler.serving.app:build``,
which calls ``settings_from_args``; ``workflows/serve.py`` does the same with its command-line overrides.
Every unknown key, wrong type and bad value is reported together (``SettingsError``), before Ray starts.

    settings = settings_from_args({"tree": "trees/seed_torch.json", "workers": 0})   # route-only

Relative paths (the tree, the profile cache) are relative to the repository root, as in ``workflows/``.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "REPO",
    "SettingsError",
    "ServeSettings",
    "check_binding",
    "is_loopback",
    "resolve_path",
    "settings_from_args",
]

REPO = Path(__file__).resolve().parents[2]
DEVICES = ("cpu", "cuda")
TASK_SIZES = ("small", "full")


class SettingsError(ValueError):
    """Every problem with the service's settings, one per line."""

    def __init__(self, problems: list[str]):
        super().__init__("invalid serve settings:\n  - " + "\n  - ".join(problems))
        self.problems = list(problems)


@dataclass(frozen=True)
class ServeSettings:
    """The service's settings (the ``args`` of ``serve_config.yaml``).

    Attributes:
        tree: the tree served at start: a JSON path (relative to the repository root) or the JSON form.
            Later trees come by hot reload (``PUT /tree``, or the ``Service`` deployment's
            ``user_config: {tree: ...}``).
        token: the bearer token every endpoint but ``/healthz`` requires; ``None``: no auth, allowed
            only while Serve binds a loopback address.
        token_env: environment variable read for the token when ``token`` is not given.
        max_body_bytes: larger request bodies get 413.
        admin: allow ``PUT /tree`` (hot reload over HTTP).
        workers: ``GpuWorker`` actors behind ``/optimize`` (0: a route-only service).
        worker_cpus: CPUs each worker holds (``None``: none, ``RayDriver.start``'s default).
        device, task_size, eval, rewriter, rewriter_options, llm, profile_cache, concurrency: the
            workers' ``WorkerSpec`` (the profile source is the tree's).
        max_jobs: ``/optimize`` jobs queued or running at once; one more gets 503.
        keep_jobs: finished jobs kept for polling (oldest forgotten first).
    """

    tree: str | dict[str, Any] = "trees/seed_torch.json"
    token: str | None = None
    token_env: str = "AUTOPROFILER_SERVE_TOKEN"
    max_body_bytes: int = 1 << 20
    admin: bool = True
    workers: int = 1
    worker_cpus: float | None = None
    device: str = "cpu"
    task_size: str = "small"
    eval: dict[str, Any] = field(default_factory=dict)
    rewriter: str = "rule"
    rewriter_options: dict[str, Any] = field(default_factory=dict)
    llm: dict[str, Any] = field(default_factory=dict)
    profile_cache: str | None = None
    concurrency: int = 1
    max_jobs: int = 16
    keep_jobs: int = 256

    def worker_spec(self, source: str):
        """The ``WorkerSpec`` of this service's workers, profiling with ``source`` (the tree's)."""
        from autoprofiler.runtime import WorkerSpec

        cache = str(resolve_path(self.profile_cache)) if self.profile_cache else None
        return WorkerSpec(
            device=self.device,
            task_size=self.task_size,
            source=source,
            eval=dict(self.eval),
            rewriter=self.rewriter,
            rewriter_options=dict(self.rewriter_options),
            llm=dict(self.llm),
            profile_cache=cache,
            concurrency=self.concurrency,
            run_id="serve",
        )


_FIELDS = {f.name: f for f in dataclasses.fields(ServeSettings)}
_TYPES: dict[str, tuple[type, ...]] = {
    "tree": (str, dict),
    "token": (str, type(None)),
    "token_env": (str,),
    "max_body_bytes": (int,),
    "admin": (bool,),
    "workers": (int,),
    "worker_cpus": (int, float, type(None)),
    "device": (str,),
    "task_size": (str,),
    "eval": (dict,),
    "rewriter": (str,),
    "rewriter_options": (dict,),
    "llm": (dict,),
    "profile_cache": (str, type(None)),
    "concurrency": (int,),
    "max_jobs": (int,),
    "keep_jobs": (int,),
}


def resolve_path(spec: str | os.PathLike) -> Path:
    """``spec`` itself when absolute, else relative to the repository root."""
    path = Path(spec)
    return path if path.is_absolute() else REPO / path


def _type_problem(name: str, value: Any) -> str | None:
    types = _TYPES[name]
    bad_bool = isinstance(value, bool) and bool not in types
    if bad_bool or not isinstance(value, types):
        expected = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        return f"{name}: expected {expected}, got {value!r} ({type(value).__name__})"
    return None


def _value_problems(s: dict[str, Any]) -> list[str]:
    p = []
    device = s["device"]
    if isinstance(device, str) and not (device in DEVICES or device.startswith("cuda:")):
        p.append(f"device: expected cpu, cuda or cuda:N, got {device!r}")
    if s["task_size"] not in TASK_SIZES:
        p.append(f"task_size: expected one of {TASK_SIZES}, got {s['task_size']!r}")
    for name, low in (("max_body_bytes", 1024), ("workers", 0), ("concurrency", 1), ("max_jobs", 1),
                      ("keep_jobs", 1)):  # fmt: skip
        if isinstance(s[name], int) and s[name] < low:
            p.append(f"{name}: expected an integer >= {low}, got {s[name]!r}")
    if s["token"] is not None and isinstance(s["token"], str) and len(s["token"]) < 8:
        p.append("token: expected at least 8 characters")
    from autoprofiler.rewriters import REWRITERS

    if s["rewriter"] not in REWRITERS:
        p.append(f"rewriter: expected one of {sorted(REWRITERS)}, got {s['rewriter']!r}")
    if isinstance(s["eval"], dict) and isinstance(s["device"], str) and isinstance(s["task_size"], str):
        from autoprofiler.evaluation import EvalConfig

        try:
            EvalConfig(device=s["device"], task_size=s["task_size"], **s["eval"])
        except (TypeError, ValueError) as exc:
            p.append(f"eval: {' '.join(str(exc).split())}")
    return p


def _tree_problem(tree: Any) -> str | None:
    from autoprofiler.serving.routing import load_served_tree

    try:
        load_served_tree(tree)
    except ValueError as exc:
        return f"tree: {' '.join(str(exc).split())[:600]}"
    return None


def settings_from_args(args: Mapping[str, Any] | None) -> ServeSettings:
    """``ServeSettings`` from a plain mapping (YAML ``args``), every problem reported at once.

    The token is ``args["token"]``, else the environment variable named by ``token_env`` (unset or
    empty: no token). The tree is loaded and validated against the metric catalog.

    Raises:
        SettingsError: unknown keys, wrong types, bad values, a tree that does not load.
    """
    args = dict(args or {})
    problems = [f"{key}: unknown key (known: {', '.join(_FIELDS)})" for key in args if key not in _FIELDS]
    values = {name: args.get(name, _default(name)) for name in _FIELDS}
    typed = [msg for name in _FIELDS if (msg := _type_problem(name, values[name]))]
    problems += typed
    if not typed:
        problems += _value_problems(values)
        tree_problem = _tree_problem(values["tree"])
        if tree_problem:
            problems.append(tree_problem)
    if problems:
        raise SettingsError(problems)
    if values["token"] is None:
        values["token"] = os.environ.get(values["token_env"]) or None
    if isinstance(values["tree"], str):
        values["tree"] = str(resolve_path(values["tree"]))
    return ServeSettings(**values)


def _default(name: str) -> Any:
    f = _FIELDS[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1) or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_binding(host: str, token: str | None) -> None:
    """Refuse to serve on a non-loopback ``host`` without a token.

    Raises:
        SettingsError: naming the host and how to set a token.
    """
    if not token and not is_loopback(host):
        raise SettingsError(
            [
                f"host {host!r} is not a loopback address and no token is set: set "
                "AUTOPROFILER_SERVE_TOKEN (or args.token) so every request needs "
                "'Authorization: Bearer <token>', or bind 127.0.0.1"
            ]
        )
