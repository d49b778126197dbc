"""Cells and the one pipeline from a cell to a reward row.

A **cell** is one unit of work: a task, what the rewriter is shown (a configuration of metric groups),
which rewriter, a seed and a refinement round; or, for a rule rewriter, one named *action* whose
candidate is evaluated whatever a profile would say. ``run_cell`` turns a cell into a ``RewardRow``:
rewrite once, evaluate the candidate in the sandbox, compute the reward. It touches no table and no
cache, so the CLI, the environments, the recording, the Ray workers and the Serve app all call it::

    cell = Cell(task, groups=("memory", "root"), rewriter=rewriter.identity)
    row = run_cell(cell, profile.restrict(cell.groups), rewriter, evaluator)
    row.correct, row.speedup, row.reward

Failures that are the candidate's (wrong output, crash, timeout) are data in the row; failures of the
machinery (no evaluation worker can start, the reference itself fails) raise from ``run_cell`` and
become a ``CellFailure`` in a worker's answer, never a row.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from autoprofiler import rewards
from autoprofiler.provenance import Provenance
from autoprofiler.tasks import Task, content_hash

if TYPE_CHECKING:
    from autoprofiler.evaluation import EvalResult
    from autoprofiler.profiling.profile import Profile
    from autoprofiler.rewriters.base import Rewrite, Rewriter

__all__ = [
    "FAILURE_KINDS",
    "Cell",
    "CellFailure",
    "CellEvaluator",
    "RewardRow",
    "WorkItem",
    "run_cell",
]

#: Why a cell has no row: the recording cannot answer it (``missing``, ``missing_profile``), the task's
#: reference or the evaluator's machinery failed (``task_error``, ``evaluator_error``), the workers that
#: ran it died every time (``worker_lost``), the run stopped before it started (``not_started``).
FAILURE_KINDS = (
    "missing",
    "missing_profile",
    "task_error",
    "evaluator_error",
    "worker_lost",
    "not_started",
)


@dataclass(frozen=True)
class Cell:
    """One unit of work (see the module docstring).

    Attributes:
        task: the program to optimize (for a refinement round > 0, the best program so far).
        groups: the metric groups shown to the rewriter, sorted and unique (``()``: blind).
        rewriter: the rewriter's identity (part of the key).
        seed, round: evaluation seed and refinement round.
        action: non-empty for an action cell: a rule rewriter's candidate for this action (no groups).
        policy: what asked for the cell ("static:memory", "action", "optimize", ...); stored in the row,
            not part of the key (cells asked for by two policies share one row).
    """

    task: Task
    groups: tuple[str, ...] = ()
    rewriter: str = ""
    seed: int = 0
    round: int = 0
    action: str = ""
    policy: str = field(default="", compare=False)

    def __post_init__(self):
        object.__setattr__(self, "groups", tuple(sorted(set(self.groups))))
        if not self.rewriter:
            raise ValueError("a cell needs the rewriter's identity")
        if self.action and self.groups:
            raise ValueError(f"an action cell shows no groups; got action {self.action!r} with {self.groups}")

    @property
    def kind(self) -> str:
        """``"action"`` or ``"configuration"`` (``rewards.CELL_KINDS``)."""
        return "action" if self.action else "configuration"

    @property
    def configuration(self) -> str:
        """Canonical name of the shown groups (``""`` for none)."""
        return rewards.configuration_name(self.groups)

    @functools.cached_property
    def key(self) -> str:
        """The reward-table key (``rewards.cell_key``); computed once per cell (a hash the environment
        and the learner look up many times)."""
        return rewards.cell_key(
            self.task.hash, self.kind, self.configuration, self.action, self.rewriter, self.seed, self.round
        )

    def describe(self) -> str:
        """``task id [hash] configuration 'a+b', rewriter r, seed 0, round 0`` (or ``action 'x'``)."""
        what = f"action {self.action!r}" if self.action else f"configuration {self.configuration!r}"
        where = f"rewriter {self.rewriter!r}, seed {self.seed}, round {self.round}"
        return f"{self.task.id} [{self.task.hash}] {what}, {where}"


@dataclass(frozen=True)
class WorkItem:
    """A cell and the profile its rewriter is shown (already restricted; ``None`` when blind)."""

    cell: Cell
    shown: Profile | None = None


@dataclass(frozen=True)
class CellFailure:
    """A cell without a row, and why (``kind`` in ``FAILURE_KINDS``; for an ``evaluator_error``,
    ``cause`` is the evaluator's ``EvaluatorError.cause``: which evaluations crowded which out, or
    ``""``)."""

    key: str
    kind: str
    message: str
    cause: str = ""

    def __post_init__(self):
        if self.kind not in FAILURE_KINDS:
            raise ValueError(f"kind: expected one of {FAILURE_KINDS}, got {self.kind!r}")


@dataclass(frozen=True)
class RewardRow:
    """One row of the reward table (``rewards.REWARD_SCHEMA``, in the same column order).

    ``reward`` and ``effective_speedup`` are computed from ``correct`` and ``speedup`` by ``build``.
    ``candidate_source`` travels with the row from the worker to the table writer, which stores it in
    the candidates table (keyed by ``candidate_hash``); it is not a reward-table column. Nor is
    ``memory``: the evaluator's memory plan (``EvalResult.details["memory_plan"]``: what it measured,
    planned and capped, and on CUDA what the candidate's process reserved at most), which a recording
    logs so that the plan's model of a candidate can be checked against what candidates used.
    """

    key: str
    task_id: str = ""
    task_hash: str = ""
    level: int = 0
    kind: str = "configuration"
    configuration: str = ""
    policy: str = ""
    rewriter: str = ""
    seed: int = 0
    round: int = 0
    action: str = ""
    candidate_hash: str = ""
    compiled: bool = False
    correct: bool = False
    error_kind: str | None = None
    error: str = ""
    ref_ms: float | None = None
    new_ms: float | None = None
    speedup: float | None = None
    reward: float = 0.0
    effective_speedup: float = 1.0
    profile_passes: int = 0
    profile_seconds: float = 0.0
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    eval_seconds: float | None = None
    device: str = ""
    profile_source: str = ""
    driver: str = ""
    ncu_version: str = ""
    torch_version: str = ""
    git_sha: str = ""
    git_dirty: bool | None = None
    run_id: str = ""
    worker: str = ""
    created_at: _dt.datetime | None = None
    candidate_source: str | None = field(default=None, repr=False, compare=False)
    memory: dict | None = field(default=None, repr=False, compare=False)

    @classmethod
    def build(cls, cell: Cell, provenance: Provenance | None = None, **outcome: Any) -> RewardRow:
        """The row of ``cell`` with these outcome fields and provenance; reward fields computed here."""
        base = {
            "key": cell.key,
            "task_id": cell.task.id,
            "task_hash": cell.task.hash,
            "level": int(cell.task.level),
            "kind": cell.kind,
            "configuration": cell.configuration,
            "policy": cell.policy or ("action" if cell.action else f"static:{cell.configuration}"),
            "rewriter": cell.rewriter,
            "seed": int(cell.seed),
            "round": int(cell.round),
            "action": cell.action,
        }
        values = {**base, **(provenance.as_row() if provenance else {}), **outcome}
        values["error"] = (values.get("error") or "")[:2000]
        values["reward"] = rewards.reward(values)
        values["effective_speedup"] = rewards.effective_speedup(values)
        values.setdefault("created_at", _dt.datetime.now(_dt.UTC).replace(microsecond=0))
        return cls(**values)

    def to_record(self) -> dict[str, Any]:
        """The reward-table columns as a dict (no ``candidate_source`` or ``memory``).

        Every column holds a scalar (str, number, bool, datetime, None), so the shallow copy is what
        ``dataclasses.asdict`` would give, without its per-value deep copy (the replay's hot path).
        """
        return {name: getattr(self, name) for name in _COLUMNS}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> RewardRow:
        """A row from a table record; columns missing from an older file take their defaults."""
        unknown = set(record) - _COLUMN_SET
        if unknown:
            raise ValueError(f"reward record has columns outside REWARD_SCHEMA: {sorted(unknown)}")
        return cls(**{k: v for k, v in record.items() if v is not None or k in _NULLABLE})

    def replace(self, **changes: Any) -> RewardRow:
        return dataclasses.replace(self, **changes)

    def for_cell(self, cell: Cell, **changes: Any) -> RewardRow:
        """This row's outcome as the row of another cell (a configuration whose rule chose this action)."""
        keep = {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name
            not in (
                "key",
                "task_id",
                "task_hash",
                "level",
                "kind",
                "configuration",
                "policy",
                "rewriter",
                "seed",
                "round",
                "reward",
                "effective_speedup",
                "created_at",
                "candidate_source",
                "memory",
            )
        }
        return RewardRow.build(cell, **{**keep, **changes})


_NULLABLE = {f.name for f in dataclasses.fields(RewardRow) if f.default is None}
#: the reward-table columns of a ``RewardRow``, in schema order (every field but those that travel with it)
_TRAVELLING = ("candidate_source", "memory")
_COLUMNS = tuple(f.name for f in dataclasses.fields(RewardRow) if f.name not in _TRAVELLING)
_COLUMN_SET = frozenset(_COLUMNS)


class CellEvaluator(Protocol):
    """What ``run_cell`` needs of an evaluator (``autoprofiler.evaluation.Evaluator`` is one)."""

    def evaluate(self, task: Task, candidate_source: str) -> EvalResult: ...


def _result_fields(result: EvalResult) -> dict[str, Any]:
    return {
        "compiled": bool(result.compiled),
        "correct": bool(result.correct),
        "error_kind": result.error_kind,
        "error": result.error or "",
        "ref_ms": result.ref_ms,
        "new_ms": result.new_ms,
        "speedup": result.speedup,
        "eval_seconds": result.wall_s,
    }


def _rewrite_fields(rewrite: Rewrite) -> dict[str, Any]:
    return {
        "llm_calls": int(rewrite.llm_calls or 0),
        "prompt_tokens": int(rewrite.prompt_tokens or 0),
        "completion_tokens": int(rewrite.completion_tokens or 0),
    }


def run_cell(
    cell: Cell,
    shown: Profile | None,
    rewriter: Rewriter,
    evaluator: CellEvaluator,
    provenance: Provenance | None = None,
    *,
    profile_cost: tuple[int, float] | None = None,
) -> RewardRow:
    """Rewrite ``cell.task`` once from the ``shown`` profile, evaluate the candidate, return its row.

    Parameters:
        cell: the cell; ``rewriter.identity`` must be ``cell.rewriter``.
        shown: the profile the rewriter sees, already restricted to ``cell.groups`` (``None``: blind).
        rewriter: ``rewrite(task, profile) -> Rewrite``; for an action cell, a rewriter of that action
            (``RuleRewriter.for_action``).
        evaluator: ``evaluate(task, source) -> EvalResult`` (sandboxed).
        provenance: columns stored in the row (device, driver, git sha, run id, ...).
        profile_cost: (passes, seconds) spent on the shown groups; default: the shown profile's own.

    Returns: the ``RewardRow``; a rewriter that produced no source gives ``error_kind="no_candidate"``.

    Raises: ``ValueError`` when the rewriter is not the cell's; whatever ``evaluator.evaluate`` raises
    for its own failures (``TaskError``, ``EvaluatorError``).
    """
    if rewriter.identity != cell.rewriter:
        raise ValueError(
            f"cell {cell.describe()} is for rewriter {cell.rewriter!r}, got {rewriter.identity!r}"
        )
    if profile_cost is None:
        profile_cost = (
            (int(shown.passes or 0), float(shown.seconds or 0.0)) if shown is not None else (0, 0.0)
        )
    rewrite = rewriter.rewrite(cell.task, shown)
    fields: dict[str, Any] = {
        **_rewrite_fields(rewrite),
        "action": cell.action or rewrite.action or "",
        "profile_passes": int(profile_cost[0]),
        "profile_seconds": float(profile_cost[1]),
    }
    if rewrite.source is None:
        fields.update(error_kind="no_candidate", error=rewrite.error or "the rewriter returned no source")
    else:
        result = evaluator.evaluate(cell.task, rewrite.source)
        fields.update(_result_fields(result))
        fields.update(candidate_hash=content_hash(rewrite.source), candidate_source=rewrite.source)
        fields.update(memory=result.details.get("memory_plan"))
        if provenance is None or not provenance.device:
            fields["device"] = result.device
    return RewardRow.build(cell, provenance, **fields)
