"""Environments: where profiles and rewards come from.

Two implementations of one small interface (``Environment``):

- ``LiveEnvironment`` runs the profiler, the rewriter and the evaluator on demand and stores everything it
  measures under one directory (``profiles/`` and ``rewards/`` Parquet tables, ``candidates/`` sources).
  Every outcome is keyed by ``rewards.outcome_key(task hash, configuration, rewriter identity, seed,
  round)`` and looked up before anything is computed, so nothing is computed twice and a crashed run
  resumes where it stopped. For a rule rewriter it also keeps one row per (task, action): configurations
  that lead to the same action share one evaluation (the decision depends on what is shown; the
  evaluation of an action does not).
- ``ReplayEnvironment`` answers from such a directory (a recording): profiles through a
  ``RecordedProfiler`` (same ``collect(task, groups)`` as ``Profiler``, reporting the recorded cost); for a
  rule rewriter every configuration is answerable (its decision is re-run on the recorded metrics
  restricted to the configuration, and the recorded outcome of the chosen action is returned); for any
  other rewriter only recorded cells are. What the recording cannot answer raises ``MissingOutcome`` or
  ``MissingProfile`` naming the cell.

``record(...)`` drives a live environment over a suite: every task with every group, every rule action.
That is what produces ``datasets/h200_suite/``.

This module imports only pyarrow and the standard library at the top (the GPU machine has no ray,
polars or openai).

Example (replay from a recorded directory):
    >>> env = ReplayEnvironment.from_dir("datasets/h200_suite", rewriter=RuleRewriter())  # doctest: +SKIP
    >>> row = env.outcome(task, "memory+speed_of_light", seed=0, round=0)                 # doctest: +SKIP
    >>> row["action"], row["speedup"]                                                     # doctest: +SKIP
    ('torch_compile', 1.31)
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import math
import re
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from autoprofiler import rewards
from autoprofiler.reward_table import ParquetTable, ProfileTable, RewardTable, dumps
from autoprofiler.tasks import Task, content_hash

__all__ = [
    "ACTION_PREFIX",
    "Environment",
    "LiveEnvironment",
    "MissingOutcome",
    "MissingProfile",
    "RecordedProfiler",
    "ReplayEnvironment",
    "configuration_groups",
    "is_rule_rewriter",
    "profile_from_dict",
    "profile_to_dict",
    "record",
    "derive_configuration_rows",
    "refinement_task",
]

logger = logging.getLogger(__name__)

# Rows that cache the evaluation of one rule action use this pseudo-configuration. Group names are
# identifiers, so it never collides with a real configuration.
ACTION_PREFIX = "action:"

CANDIDATE_SCHEMA = pa.schema([("key", pa.string()), ("task_hash", pa.string()), ("source", pa.string())])


class MissingOutcome(LookupError):
    """The recording holds no outcome for the asked cell (task, configuration, rewriter, seed, round)."""


class MissingProfile(LookupError):
    """The recording holds no profile for a (task, group) that was asked for."""


class Environment(Protocol):
    """Where rewards come from.

    ``profiler`` is what policies call ``collect(task, groups)`` on. ``outcome`` returns one reward row
    (a dict with the columns of ``rewards.REWARD_SCHEMA``).
    """

    profiler: Any
    rewriter: Any

    def profile(self, task: Task, groups: Iterable[str]) -> Any: ...

    def outcome(
        self, task: Task, configuration: str, rewriter: Any = None, seed: int = 0, round: int = 0
    ) -> dict: ...

    def group_cost(self, task: Task, groups: Iterable[str]) -> tuple[int, float]: ...


# --- small helpers -----------------------------------------------------------------------------------
def configuration_groups(configuration: str | Iterable[str]) -> tuple[str, ...]:
    """The sorted groups of a configuration name (``"memory+speed_of_light"``) or of a group iterable.

    >>> configuration_groups("stalls+memory")
    ('memory', 'stalls')
    >>> configuration_groups("")
    ()
    """
    if isinstance(configuration, str):
        if configuration.startswith(ACTION_PREFIX):
            raise ValueError(f"{configuration!r} is an action cell, not a configuration of metric groups")
        parts = [p for p in configuration.split("+") if p]
    else:
        parts = list(configuration)
    return tuple(sorted(set(parts)))


def is_rule_rewriter(rewriter: Any) -> bool:
    """True for a rewriter whose choice is a named action (``decide``/``source_for``), like RuleRewriter."""
    return callable(getattr(rewriter, "decide", None)) and callable(getattr(rewriter, "source_for", None))


def rewriter_identity(rewriter: Any) -> str:
    """The rewriter's identity string (a string passes through)."""
    if isinstance(rewriter, str):
        return rewriter
    identity = getattr(rewriter, "identity", None)
    if not identity:
        raise ValueError(f"a rewriter needs a non-empty 'identity' attribute; got {type(rewriter).__name__}")
    return str(identity)


def actions_identity(rewriter: Any) -> str:
    """The identity that keys a rule rewriter's action rows (its ``actions_identity``, else ``identity``)."""
    return str(getattr(rewriter, "actions_identity", None) or rewriter_identity(rewriter))


def profile_to_dict(profile: Any) -> dict[str, Any]:
    """A ``Profile`` as JSON-able data (the form stored in profile tables)."""
    if hasattr(profile, "to_dict"):
        d = dict(profile.to_dict())
    else:
        d = {f.name: getattr(profile, f.name) for f in dataclasses.fields(profile)}
    d["groups"] = sorted(d.get("groups", ()))
    return d


def profile_from_dict(d: dict[str, Any]) -> Any:
    """Inverse of ``profile_to_dict``."""
    from autoprofiler.profiling.profile import Profile  # lazy: the profiling package is heavier

    if hasattr(Profile, "from_dict"):
        return Profile.from_dict(d)
    names = {f.name for f in dataclasses.fields(Profile)}
    kwargs = {k: v for k, v in d.items() if k in names}
    kwargs["groups"] = frozenset(kwargs.get("groups", ()))
    return Profile(**kwargs)


def _with_cost(profile: Any, passes: int, seconds: float) -> Any:
    return dataclasses.replace(profile, passes=int(passes), seconds=float(seconds))


def _git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def refinement_task(task: Task, candidate_source: str, round: int) -> Task:
    """The program that round ``round`` optimizes: the best candidate so far, as a KernelBench task.

    The candidate's ``ModelNew`` becomes ``Model``: when the candidate defines ``get_inputs`` itself, its
    ``ModelNew`` tokens are renamed; otherwise the candidate is appended to the reference (which brings
    ``get_inputs``/``get_init_inputs``) followed by ``Model = ModelNew``. The next round is then evaluated
    against the previous best, and the speedup over the original is the product of the rounds'.
    """
    if re.search(r"^def\s+get_inputs\b", candidate_source, re.MULTILINE):
        source = re.sub(r"\bModelNew\b", "Model", candidate_source)
    else:
        source = (
            f"{task.source.rstrip()}\n\n# --- best candidate before round {round} ---\n"
            f"{candidate_source.rstrip()}\n\nModel = ModelNew\n"
        )
    return Task.from_source(
        f"{task.id}@r{round}", source, level=task.level, tags=task.tags, origin=task.origin
    )


# --- the reward row ----------------------------------------------------------------------------------
def _result_fields(result: Any) -> dict[str, Any]:
    if result is None:
        return {}
    d = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    return {
        "compiled": bool(d.get("compiled")),
        "correct": bool(d.get("correct")),
        "error_kind": d.get("error_kind"),
        "error": (d.get("error") or "")[:2000],
        "ref_ms": d.get("ref_ms"),
        "new_ms": d.get("new_ms"),
        "speedup": d.get("speedup"),
        "eval_seconds": d.get("wall_s"),
        "device": d.get("device") or "",
    }


def make_row(
    task: Task, configuration: str, rewriter_id: str, seed: int, round: int, **fields
) -> dict[str, Any]:
    """One reward row; ``reward`` and ``effective_speedup`` are computed here from correct/speedup."""
    row = {
        "key": rewards.outcome_key(task.hash, configuration, rewriter_id, seed, round),
        "task_id": task.id,
        "task_hash": task.hash,
        "level": int(task.level),
        "configuration": configuration,
        "rewriter": rewriter_id,
        "seed": int(seed),
        "round": int(round),
        "compiled": False,
        "correct": False,
        "llm_calls": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "profile_passes": 0,
        "profile_seconds": 0.0,
    }
    row.update(fields)
    row["reward"] = rewards.reward(row)
    row["effective_speedup"] = rewards.effective_speedup(row)
    return row


# --- profiles ----------------------------------------------------------------------------------------
class RecordedProfiler:
    """Answers ``collect(task, groups)`` from a profile table, like ``Profiler`` does from the GPU.

    Like ``Profiler``, collection is cumulative per task: the returned profile holds every group collected
    so far for the task, and ``passes``/``seconds`` are the recorded cost of the groups new to this call.
    ``reset()`` forgets what was collected (a fresh policy evaluation starts from nothing).

    Raises:
        MissingProfile: a group that was not recorded for the task (the message names both).
    """

    def __init__(self, table: ProfileTable, source: str | None = None):
        self.table = table
        self.source = source
        self._collected: dict[str, set[str]] = {}
        self._parsed: dict[tuple[str, str], Any] = {}

    def reset(self) -> None:
        self._collected.clear()

    def recorded_groups(self, task: Task) -> set[str]:
        return set(self.table.groups_for(task.hash, self.source))

    def _rows(self, task: Task, groups: set[str]) -> dict[str, dict]:
        recorded = self.table.groups_for(task.hash, self.source)
        missing = sorted(groups - set(recorded))
        if missing:
            have = sorted(recorded)
            raise MissingProfile(
                f"no recorded profile for task {task.id!r} (hash {task.hash}) group(s) {missing}; "
                f"recorded groups for it: {have or 'none'}"
            )
        return recorded

    def _profile(self, task: Task, recorded: dict[str, dict], groups: Iterable[str]) -> Any:
        """The merge of the recorded per-group profiles of ``groups`` (each group's own metrics)."""
        profile = None
        for g in sorted(groups):
            key = (task.hash, g)
            if key not in self._parsed:
                text = recorded[g]["profile_json"]
                if not text:
                    raise MissingProfile(
                        f"task {task.id!r} (hash {task.hash}) group {g!r} has a cost row but no metrics"
                    )
                self._parsed[key] = profile_from_dict(json.loads(text))
            part = self._parsed[key]
            profile = part if profile is None else profile.merge(part)
        return profile

    def cost(self, task: Task, groups: Iterable[str]) -> tuple[int, float]:
        """Recorded (passes, seconds) of collecting ``groups`` for ``task`` from nothing."""
        groups = set(groups)
        recorded = self._rows(task, groups)
        return (
            sum(int(recorded[g]["passes"] or 0) for g in groups),
            sum(float(recorded[g]["seconds"] or 0.0) for g in groups),
        )

    def snapshot(self, task: Task, groups: Iterable[str]) -> Any:
        """The recorded profile restricted to ``groups``, at their standalone cost; no state changes."""
        groups = set(groups)
        recorded = self._rows(task, groups)
        passes, seconds = self.cost(task, groups)
        if not groups:
            return None
        return _with_cost(self._profile(task, recorded, groups), passes, seconds)

    def collect(self, task: Task, groups: Iterable[str]) -> Any:
        groups = set(groups)
        recorded = self._rows(task, groups)
        seen = self._collected.setdefault(task.hash, set())
        new = groups - seen
        passes = sum(int(recorded[g]["passes"] or 0) for g in new)
        seconds = sum(float(recorded[g]["seconds"] or 0.0) for g in new)
        seen |= groups
        profile = self._profile(task, recorded, seen)
        return None if profile is None else _with_cost(profile, passes, seconds)


class _RecordingProfiler:
    """Wraps a live ``Profiler``: collects one group at a time and records each group's cost and metrics.

    Profiles are answered from the profile table (through a ``RecordedProfiler``), so a resumed run
    never collects a recorded group again, even with a profiler that has no cache of its own.
    """

    def __init__(self, inner: Any, table: ProfileTable, run_id: str):
        self.inner = inner
        self.table = table
        self.run_id = run_id
        self.source = getattr(inner, "source", "ncu")
        self.recorded = RecordedProfiler(table, self.source)

    def _known(self, task: Task) -> set[str]:
        return set(self.table.groups_for(task.hash, self.source))

    def record_group(self, task: Task, group: str, profile: Any) -> None:
        self.table.append(
            {
                "key": ProfileTable.make_key(task.hash, self.source, group),
                "task_id": task.id,
                "task_hash": task.hash,
                "level": int(task.level),
                "source": self.source,
                "group": group,
                "passes": int(profile.passes or 0),
                "seconds": float(profile.seconds or 0.0),
                "device": str(getattr(profile, "device", "")),
                "profile_json": dumps(profile_to_dict(profile.restrict([group]))),
                "run_id": self.run_id,
            }
        )

    def _record_joint(self, task: Task, profile: Any, new: list[str]) -> None:
        """Record the groups ``new`` from one joint collection, apportioning its cost among them.

        The share of each group is its catalog pass count when every one is known (ncu), else equal.
        ``environments.record`` collects one group per process instead, so recorded suites carry each
        group's own cost.
        """
        from autoprofiler.profiling.groups import GROUPS

        known = [GROUPS[g].passes if g in GROUPS else None for g in new]
        weights = known if all(k for k in known) else [1] * len(new)
        total = float(sum(weights)) or 1.0
        for g, w in zip(new, weights, strict=True):
            share = dataclasses.replace(
                profile,
                passes=round(int(profile.passes or 0) * w / total),
                seconds=float(profile.seconds or 0.0) * w / total,
            )
            self.record_group(task, g, share)

    def ensure(self, task: Task, groups: Iterable[str]) -> tuple[int, float]:
        """Collect (in one profiler call) and record the groups not recorded yet; returns their cost."""
        new = sorted(set(groups) - self._known(task))
        if not new:
            return 0, 0.0
        p = self.inner.collect(task, new)
        self._record_joint(task, p, new)
        return int(p.passes or 0), float(p.seconds or 0.0)

    def prefetch(self, tasks: Sequence[Task], groups: Iterable[str]) -> list[dict[str, str]]:
        """Collect every missing group of every task in as few processes as the profiler allows.

        Uses the profiler's ``collect_many`` (one process per distinct missing set). Returns failures
        ``[{"task_id", "error"}]``; the other tasks are recorded.
        """
        groups = sorted(set(groups))
        todo = [t for t in tasks if set(groups) - self._known(t)]
        if not todo:
            return []
        news = {t.hash: sorted(set(groups) - self._known(t)) for t in todo}
        failures: list[dict[str, str]] = []
        if callable(getattr(self.inner, "remember", None)):  # e.g. the root's kernel count -> range replay
            for t in todo:
                held = [g for g in self._known(t) if g in groups]
                if held:
                    self.inner.remember(self.recorded.snapshot(t, held))
        if callable(getattr(self.inner, "collect_many", None)):
            try:
                by_missing: dict[tuple[str, ...], list[Task]] = {}
                for t in todo:  # ask each batch for what its tasks miss, not for what is recorded
                    by_missing.setdefault(tuple(news[t.hash]), []).append(t)
                for missing, batch in by_missing.items():
                    for t, p in zip(batch, self.inner.collect_many(batch, list(missing)), strict=True):
                        self._record_joint(t, p, news[t.hash])
                return []
            except Exception as e:  # isolate the failing tasks, keep the others
                bad = getattr(e, "failures", None) or {}
                logger.warning("batch profiling failed for %d task(s): %s", len(bad) or len(todo), e)
                for t in todo:
                    if t.hash in bad:
                        failures.append({"task_id": t.id, "error": str(bad[t.hash])[:500]})
                        todo = [x for x in todo if x.hash != t.hash]
                if callable(getattr(self.inner, "forget", None)):
                    for t in todo:
                        self.inner.forget(t.hash)  # collected in the failed batch: re-collect for its cost
        for t in todo:
            if set(groups) - self._known(t):
                try:
                    self.ensure(t, groups)
                except Exception as e:
                    failures.append({"task_id": t.id, "error": f"{type(e).__name__}: {e}"[:500]})
        return failures

    def collect(self, task: Task, groups: Iterable[str]) -> Any:
        groups = set(groups)
        passes, seconds = self.ensure(task, groups)
        profile = self.recorded.collect(task, groups)
        return None if profile is None else _with_cost(profile, passes, seconds)

    def snapshot(self, task: Task, groups: Iterable[str]) -> Any:
        self.ensure(task, groups)
        return self.recorded.snapshot(task, groups)

    def cost(self, task: Task, groups: Iterable[str]) -> tuple[int, float]:
        self.ensure(task, groups)
        return self.recorded.cost(task, groups)

    def reset(self) -> None:
        """Forget what was collected per task (the table keeps everything: nothing is re-collected)."""
        self.recorded.reset()


# --- environments ------------------------------------------------------------------------------------
@dataclasses.dataclass
class EnvStats:
    """Counters: outcomes asked, answered from the table, evaluations actually run (live)."""

    asked: int = 0
    from_table: int = 0
    evaluations: int = 0
    action_reuse: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class _EnvironmentBase:
    rewriter: Any
    rewards: RewardTable
    profiles: ProfileTable
    candidates: ParquetTable
    profiler: Any

    def prefetch(self, tasks: Sequence[Task], groups: Iterable[str]) -> list[dict[str, str]]:
        """Make sure every (task, group) is available; live: batch-collect what is missing."""
        fetch = getattr(self.profiler, "prefetch", None)
        return fetch(tasks, groups) if fetch is not None else []

    def profile(self, task: Task, groups: Iterable[str]) -> Any:
        """The task's profile with (at least) these groups; cumulative like ``Profiler.collect``."""
        return self.profiler.collect(task, groups)

    def group_cost(self, task: Task, groups: Iterable[str]) -> tuple[int, float]:
        """(passes, seconds) of collecting these groups for the task from nothing."""
        groups = list(groups)
        return self.profiler.cost(task, groups) if groups else (0, 0.0)

    def candidate_source(self, candidate_hash: str) -> str | None:
        row = self.candidates.get(candidate_hash)
        return None if row is None else row["source"]

    def rows(self) -> list[dict]:
        return self.rewards.rows()

    def _resolve(self, rewriter: Any) -> Any:
        rewriter = self.rewriter if rewriter is None else rewriter
        if rewriter is None:
            raise ValueError("no rewriter: pass one to outcome() or to the environment")
        return rewriter

    def _config_row_from_action(
        self, task: Task, configuration: str, rewriter_id: str, seed: int, round: int, arow: dict, reason: str
    ) -> dict:
        passes, seconds = self.group_cost(task, configuration_groups(configuration))
        keep = {
            k: arow[k]
            for k in (
                "action",
                "candidate_hash",
                "compiled",
                "correct",
                "error_kind",
                "error",
                "ref_ms",
                "new_ms",
                "speedup",
                "eval_seconds",
                "device",
                "profile_source",
                "driver",
                "ncu_version",
                "git_sha",
                "run_id",
            )
        }
        keep["error"] = keep["error"] or ""
        return make_row(
            task,
            configuration,
            rewriter_id,
            seed,
            round,
            policy=f"static:{configuration}",
            profile_passes=passes,
            profile_seconds=seconds,
            **keep,
        )

    def close(self) -> None:
        for t in (self.rewards, self.profiles, self.candidates):
            t.flush()


class LiveEnvironment(_EnvironmentBase):
    """Profiles, rewrites and evaluates on demand; stores everything under ``table_dir``.

    Args:
        profiler: a ``Profiler`` (``collect(task, groups)``).
        rewriter: the default rewriter (``identity``; ``rewrite(task, profile)``; a rule rewriter also
            ``decide(profile) -> (action, reason)`` and ``source_for(task, action)``).
        evaluator: an ``Evaluator`` (``evaluate(task, source) -> EvalResult``).
        table_dir: directory for ``rewards/``, ``profiles/`` and ``candidates/`` Parquet tables.
        flush_every: rows buffered before a Parquet part is written.
        run_id, provenance: stored in every row (``driver``, ``ncu_version``, ``device``, ...).
    """

    def __init__(
        self,
        profiler: Any,
        rewriter: Any,
        evaluator: Any,
        table_dir: str | Path,
        flush_every: int = 4,
        run_id: str | None = None,
        provenance: dict[str, str] | None = None,
    ):
        self.table_dir = Path(table_dir)
        self.rewriter = rewriter
        self.evaluator = evaluator
        self.run_id = run_id or _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S-") + uuid.uuid4().hex[:6]
        self.rewards = RewardTable(self.table_dir / "rewards", flush_every=flush_every)
        self.profiles = ProfileTable(self.table_dir / "profiles", flush_every=flush_every)
        self.candidates = ParquetTable(
            self.table_dir / "candidates", CANDIDATE_SCHEMA, flush_every=flush_every
        )
        self.profiler = _RecordingProfiler(profiler, self.profiles, self.run_id)
        self.provenance = {  # in every row; "device" names the hardware (a GPU name when given)
            "git_sha": _git_sha(),
            "profile_source": self.profiler.source,
            "device": str(getattr(getattr(evaluator, "config", None), "device", "") or ""),
            **(provenance or {}),
        }
        self.provenance = {k: v for k, v in self.provenance.items() if v}
        self.stats = EnvStats()

    def _evaluate(self, task: Task, source: str) -> dict[str, Any]:
        chash = content_hash(source)
        self.candidates.append({"key": chash, "task_hash": task.hash, "source": source})
        t0 = time.perf_counter()
        result = self.evaluator.evaluate(task, source)
        self.stats.evaluations += 1
        fields = _result_fields(result)
        fields.setdefault("eval_seconds", time.perf_counter() - t0)
        fields["candidate_hash"] = chash
        return fields

    def action_outcome(
        self, task: Task, action: str, rewriter: Any = None, seed: int = 0, round: int = 0
    ) -> dict:
        """The (cached) outcome of applying a rule rewriter's ``action`` to the task."""
        rewriter = self._resolve(rewriter)
        rid = actions_identity(rewriter)
        cell = ACTION_PREFIX + action
        key = rewards.outcome_key(task.hash, cell, rid, seed, round)
        row = self.rewards.get(key)
        if row is not None:
            return row
        try:
            source = rewriter.source_for(task, action)
        except Exception as e:  # a rewriter fault is data, not a crash of the run
            logger.warning("rule action %s failed to produce a candidate for %s: %s", action, task.id, e)
            source = None
            fields = {"error_kind": "no_candidate", "error": f"{type(e).__name__}: {e}"[:2000]}
        if source is not None:  # an evaluator failure (not a candidate's) propagates: nothing is recorded
            fields = self._evaluate(task, source)
        row = make_row(
            task,
            cell,
            rid,
            seed,
            round,
            action=action,
            policy="action",
            run_id=self.run_id,
            **{**fields, **self.provenance},
        )
        self.rewards.append(row)
        return self.rewards.get(row["key"])

    def outcome(
        self, task: Task, configuration: str, rewriter: Any = None, seed: int = 0, round: int = 0
    ) -> dict:
        """The reward row of (task, configuration, rewriter, seed, round): from the table, else computed.

        ``configuration`` is a canonical configuration name (``rewards.configuration_name``). For a
        refinement round > 0 pass the task built by ``refinement_task`` (the program being improved).
        """
        rewriter = self._resolve(rewriter)
        rid = rewriter_identity(rewriter)
        configuration = "+".join(configuration_groups(configuration))
        self.stats.asked += 1
        key = rewards.outcome_key(task.hash, configuration, rid, seed, round)
        row = self.rewards.get(key)
        if row is not None:
            self.stats.from_table += 1
            return row
        groups = configuration_groups(configuration)
        shown = self.profiler.snapshot(task, groups) if groups else None
        if is_rule_rewriter(rewriter):
            action, reason = rewriter.decide(shown)
            before = self.stats.evaluations
            arow = self.action_outcome(task, action, rewriter, seed, round)
            if self.stats.evaluations == before:
                self.stats.action_reuse += 1
            row = self._config_row_from_action(task, configuration, rid, seed, round, arow, reason)
        else:
            rewrite = rewriter.rewrite(task, shown)
            fields = (
                self._evaluate(task, rewrite.source)
                if rewrite.source
                else {
                    "error_kind": "no_candidate",
                    "error": (rewrite.error or "the rewriter returned no source")[:2000],
                }
            )
            passes, seconds = self.group_cost(task, groups)
            row = make_row(
                task,
                configuration,
                rid,
                seed,
                round,
                policy=f"static:{configuration}",
                action=getattr(rewrite, "action", "") or "",
                llm_calls=int(rewrite.llm_calls or 0),
                prompt_tokens=int(rewrite.prompt_tokens or 0),
                completion_tokens=int(rewrite.completion_tokens or 0),
                profile_passes=passes,
                profile_seconds=seconds,
                run_id=self.run_id,
                **{**fields, **self.provenance},
            )
        self.rewards.append(row)
        return self.rewards.get(row["key"])


class ReplayEnvironment(_EnvironmentBase):
    """Answers profiles and outcomes from a recording (profile table + reward table).

    Args:
        profile_table, reward_table: ``ProfileTable`` / ``RewardTable`` (or their directories).
        rewriter: the default rewriter; a rule rewriter's decision is re-run on recorded metrics.
        source: which profile source to answer from ("ncu" or "torch"); None takes any.
        candidate_dir: optional directory of recorded candidate sources (for refinement rounds).

    Raises (from ``outcome``/``profile``): ``MissingOutcome``, ``MissingProfile``.
    """

    def __init__(
        self,
        profile_table: ProfileTable | str | Path,
        reward_table: RewardTable | str | Path,
        rewriter: Any = None,
        source: str | None = None,
        candidate_dir: str | Path | None = None,
    ):
        self.profiles = (
            profile_table if isinstance(profile_table, ProfileTable) else ProfileTable(profile_table)
        )
        self.rewards = reward_table if isinstance(reward_table, RewardTable) else RewardTable(reward_table)
        self.candidates = ParquetTable(
            candidate_dir or Path(self.rewards.directory).parent / "candidates", CANDIDATE_SCHEMA
        )
        self.rewriter = rewriter
        self.profiler = RecordedProfiler(self.profiles, source)
        self.stats = EnvStats()

    @classmethod
    def from_dir(
        cls, table_dir: str | Path, rewriter: Any = None, source: str | None = None
    ) -> ReplayEnvironment:
        """A replay of ``table_dir/profiles`` and ``/rewards`` (what ``LiveEnvironment`` writes)."""
        table_dir = Path(table_dir)
        for sub in ("profiles", "rewards"):
            if not (table_dir / sub).is_dir():
                raise FileNotFoundError(
                    f"expected a recording with {sub}/ under {table_dir}; it is not there"
                )
        return cls(table_dir / "profiles", table_dir / "rewards", rewriter, source, table_dir / "candidates")

    def group_cost(self, task: Task, groups: Iterable[str]) -> tuple[int, float]:
        groups = list(groups)
        return self.profiler.cost(task, groups) if groups else (0, 0.0)

    def recorded_tasks(self) -> set[str]:
        """Hashes of tasks that have at least one recorded profile group."""
        return {r["task_hash"] for r in self.profiles.rows()}

    def fully_recorded(self, tasks: Sequence[Task]) -> tuple[list[Task], dict[str, list[str]]]:
        """The recorded ``tasks`` that hold every group any of them holds, and, by task id, what the others
        lack: judge policies on the first list only, so each one answers every task."""
        recorded = self.recorded_tasks()
        have = {t.hash: self.profiler.recorded_groups(t) for t in tasks if t.hash in recorded}
        union = set().union(*have.values())
        mine = [t for t in tasks if t.hash in have]
        lacking = {t.id: sorted(union - have[t.hash]) for t in mine if union - have[t.hash]}
        return [t for t in mine if t.id not in lacking], lacking

    def outcome(
        self, task: Task, configuration: str, rewriter: Any = None, seed: int = 0, round: int = 0
    ) -> dict:
        rewriter = self._resolve(rewriter)
        rid = rewriter_identity(rewriter)
        configuration = "+".join(configuration_groups(configuration))
        self.stats.asked += 1
        if is_rule_rewriter(rewriter):
            groups = configuration_groups(configuration)
            shown = None
            if groups:
                shown = self.profiler.snapshot(task, groups)
            action, reason = rewriter.decide(shown)
            aid = actions_identity(rewriter)
            key = rewards.outcome_key(task.hash, ACTION_PREFIX + action, aid, seed, round)
            arow = self.rewards.get(key)
            if arow is None:
                raise MissingOutcome(
                    f"no recorded outcome for task {task.id!r} (hash {task.hash}) action {action!r} "
                    f"(chosen for configuration {configuration!r}), rewriter {aid!r}, seed {seed}, "
                    f"round {round}"
                )
            self.stats.from_table += 1
            return self._config_row_from_action(task, configuration, rid, seed, round, arow, reason)
        key = rewards.outcome_key(task.hash, configuration, rid, seed, round)
        row = self.rewards.get(key)
        if row is None:
            raise MissingOutcome(
                f"no recorded outcome for task {task.id!r} (hash {task.hash}) configuration "
                f"{configuration!r}, rewriter {rid!r}, seed {seed}, round {round}: "
                "only recorded cells are answerable for a rewriter that is not rule-based"
            )
        self.stats.from_table += 1
        return row


# --- recording a suite -------------------------------------------------------------------------------
def record(
    tasks: Sequence[Task],
    env: LiveEnvironment,
    groups: Sequence[str],
    configurations: dict[str, Sequence[str]] | None = None,
    seeds: Sequence[int] = (0,),
    max_seconds: float | None = None,
    jobs: int = 1,
    joint: bool = False,
    joint_batch: int = 8,
) -> dict[str, Any]:
    """Profile every task with every group and evaluate every rule action (and fixed configurations).

    ``jobs`` > 1 evaluates that many (task, action) candidates at once from threads sharing the
    evaluator (each candidate still in its own sandboxed process); give the evaluator a
    ``timing_lock`` then, so compilation and correctness checks overlap while timing stays exclusive.

    ``joint`` collects every missing group of a task in one profiled process first (``prefetch``: one
    ncu run with the union of the groups' metrics) and apportions its cost among the groups by their
    catalog pass counts; what fails there is retried one group at a time below. On the H200 one group per
    process cost 75-100 s for 24 tasks (ncu start-up and the program's warm-up every time), so a full
    recording of 10 groups one by one did not fit a 10-minute call. Joint collection goes ``joint_batch``
    tasks per profiled process and writes each batch's rows before the next starts, so a run that is
    stopped (``max_seconds``, or killed from outside) loses at most one batch.

    Profiles are collected one group at a time over the whole suite with the profiler's batch mode
    (``collect_many``: one process per group, and each group's own cost recorded); a batch that fails is
    retried task by task so one bad task costs only itself. Then, per task, every action of the rule
    rewriter is evaluated once, and every fixed configuration's row is written (its decision re-uses the
    action's evaluation). Everything is keyed, so calling ``record`` again resumes; ``max_seconds`` stops
    starting new work after that long (``summary["complete"]`` says whether all was done).

    Returns a summary: counts, failures ``[{"task_id", "stage", "error"}]``, seconds, complete.
    """
    t0 = time.perf_counter()

    def out_of_time() -> bool:
        return max_seconds is not None and time.perf_counter() - t0 > max_seconds

    failures: list[dict[str, str]] = []
    failed_profile: set[str] = set()
    inner = env.profiler.inner
    complete = True
    if joint:
        todo = [t for t in tasks if set(groups) - env.profiler._known(t)]
        step = max(1, int(joint_batch))
        for i in range(0, len(todo), step):
            if out_of_time():
                complete = False
                break
            for f in env.profiler.prefetch(todo[i : i + step], groups):
                logger.warning("joint profiling failed for %s (%s)", f.get("task_id"), f)
            env.profiles.flush()
            logger.info("joint profiling: %d/%d tasks", min(i + step, len(todo)), len(todo))
    for g in groups:
        if out_of_time():
            complete = False
            break
        todo = [t for t in tasks if g not in env.profiler._known(t)]
        if not todo:
            continue
        if callable(getattr(inner, "collect_many", None)):
            try:
                for t, p in zip(todo, inner.collect_many(todo, [g]), strict=True):
                    env.profiler.record_group(t, g, p)
                env.profiles.flush()
                continue
            except Exception as e:  # isolate the failing task(s); the others are collected one by one
                logger.warning("batch profiling of group %s failed (%s); retrying task by task", g, e)
                if callable(getattr(inner, "forget", None)):
                    for t in todo:
                        inner.forget(t.hash)
        for t in todo:
            try:
                env.profiler.ensure(t, [g])
            except Exception as e:
                failed_profile.add(t.hash)
                failures.append(
                    {"task_id": t.id, "stage": f"profile:{g}", "error": f"{type(e).__name__}: {e}"[:500]}
                )
        env.profiles.flush()
    rewriter = env.rewriter
    actions = list(rewriter.actions()) if is_rule_rewriter(rewriter) else []
    if jobs > 1 and actions:  # fan the (task, action) evaluations out; the loop below then finds them
        cells = [(t, a, s) for t in tasks for s in seeds for a in actions]

        def one(cell):
            if out_of_time():
                return
            t, a, s = cell
            env.action_outcome(t, a, rewriter, s, 0)

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for fut in [pool.submit(one, c) for c in cells]:
                fut.result()
        env.rewards.flush()
    for t in tasks:  # map over (task, action): the shape a Ray fan-out takes later
        if out_of_time():
            complete = False
            break
        for seed in seeds:
            for action in actions:
                env.action_outcome(t, action, rewriter, seed, 0)
            if t.hash in failed_profile:
                continue
            for name, cfg in (configurations or {}).items():
                try:
                    env.outcome(t, "+".join(configuration_groups(cfg)), rewriter, seed, 0)
                except Exception as e:
                    failures.append(
                        {
                            "task_id": t.id,
                            "stage": f"outcome:{name}",
                            "error": f"{type(e).__name__}: {e}"[:500],
                        }
                    )
        env.rewards.flush()
    env.close()
    return {
        "tasks": len(tasks),
        "groups": list(groups),
        "actions": actions,
        "profile_rows": len(env.profiles),
        "reward_rows": len(env.rewards),
        "evaluations": env.stats.evaluations,
        "failures": failures,
        "seconds": round(time.perf_counter() - t0, 2),
        "complete": complete,
        "status": dict(Counter(str(r.get("error_kind")) for r in env.rewards.rows())),
    }


def derive_configuration_rows(
    env: ReplayEnvironment,
    tasks: Sequence[Task],
    configurations: dict[str, Sequence[str]],
    seeds: Sequence[int] = (0,),
) -> dict[str, Any]:
    """Write each (task, fixed configuration) row a rule rewriter's recording implies into its reward table.

    For a recording made with ``oracle_sweep.py --evaluate-only`` (or under an older rule version): the
    row is what ``LiveEnvironment.outcome`` would have written, the rule's decision on the recorded
    profile restricted to the configuration joined with the recorded evaluation of that action, keyed by
    the rewriter's current identity. Tasks lacking a recorded group or action are listed, not written.
    Rows already present are kept (nothing is computed twice). Returns ``{"written", "missing"}``.
    """
    written, missing = 0, []
    for t in tasks:
        for seed in seeds:
            for name, cfg in configurations.items():
                try:
                    row = env.outcome(t, "+".join(configuration_groups(cfg)), None, seed, 0)
                except (MissingProfile, MissingOutcome) as e:
                    missing.append({"task_id": t.id, "configuration": name, "error": str(e)[:300]})
                    continue
                written += bool(env.rewards.append(row))
    env.rewards.flush()
    return {"written": written, "missing": missing}


def finite(x: Any) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)
