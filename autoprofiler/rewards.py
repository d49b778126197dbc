"""The one definition of speedup, reward and effective speedup, and the reward-table schema.

Choice (documented in README): the paper rewards a rewrite only when it is correct *and* faster than the
original. We use ``reward = max(0, log(speedup))`` for a correct candidate and ``0`` otherwise:

- log makes rewards additive over tasks (their mean is the log of the geometric-mean speedup, the
  number KernelBench-style reports quote), and symmetric for 2x faster / 2x slower;
- clipping at 0 says what a deployment does: a slower or wrong candidate is discarded and the original
  kept, so it neither helps nor hurts.

``effective_speedup`` is the speedup a user gets: the candidate's when correct, else 1.0 (original kept).
Note effective speedup is *not* clipped at 1.0 for correct-but-slower candidates: reports follow
KernelBench and show the measured ratio; ``reward`` is what the learner maximizes by default.

``OBJECTIVES`` names what the learner may maximize instead: ``log_speedup`` is ``log(effective
speedup)``, unclipped, whose mean is the log of the geomean effective speedup that policies are judged
by. Under ``reward`` a profile that turns a 0.2x rewrite into a 1.0x one gains nothing (both are 0);
under ``log_speedup`` it gains log 5.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import pyarrow as pa

__all__ = [
    "OBJECTIVES",
    "REWARD_SCHEMA",
    "REWARD_KEY_COLUMNS",
    "CELL_KINDS",
    "SCHEMA_VERSION",
    "cell_key",
    "configuration_name",
    "effective_speedup",
    "objective",
    "outcome_key",
    "reward",
    "speedup",
]


def speedup(ref_ms: float | None, new_ms: float | None) -> float | None:
    """Reference time over candidate time; ``None`` when either is missing or not positive.

    >>> speedup(2.0, 1.0)
    2.0
    """
    if ref_ms is None or new_ms is None or not (ref_ms > 0 and new_ms > 0):
        return None
    return ref_ms / new_ms


def _fields(result: Any) -> tuple[bool, float | None]:
    """(correct, speedup) from an EvalResult, a reward row (dict) or anything with those attributes."""
    if isinstance(result, dict):
        return bool(result.get("correct")), result.get("speedup")
    return bool(result.correct), result.speedup


def reward(result: Any) -> float:
    """``max(0, log(speedup))`` when the candidate is correct and timed, else ``0.0``.

    >>> reward({"correct": True, "speedup": 2.0}) == math.log(2.0)
    True
    >>> reward({"correct": False, "speedup": 5.0})
    0.0
    """
    correct, s = _fields(result)
    if not correct or s is None or not s > 0:
        return 0.0
    return max(0.0, math.log(s))


def effective_speedup(result: Any) -> float:
    """The speedup a user gets: the candidate's when correct and timed, else 1.0 (the original is kept)."""
    correct, s = _fields(result)
    if not correct or s is None or not s > 0:
        return 1.0
    return float(s)


def log_speedup(result: Any) -> float:
    """``log(effective_speedup)``: negative for a correct but slower candidate, 0 when not correct.

    >>> round(log_speedup({"correct": True, "speedup": 0.5}), 4)
    -0.6931
    """
    return math.log(effective_speedup(result))


OBJECTIVES = {"reward": reward, "log_speedup": log_speedup}


def objective(result: Any, name: str = "reward") -> float:
    """The value of one outcome under the learner objective ``name`` (a key of ``OBJECTIVES``)."""
    try:
        return OBJECTIVES[name](result)
    except KeyError:
        raise ValueError(f"unknown objective {name!r}; expected one of {sorted(OBJECTIVES)}") from None


REWARD_KEY_COLUMNS = ("task_hash", "kind", "configuration", "action", "rewriter", "seed", "round")

#: What a reward row holds: the outcome of a *configuration* (the rewriter was shown these metric groups
#: and chose what to write) or of an *action* (a rule rewriter's candidate for one named action, whatever
#: a profile would say; configuration rows of a rule rewriter are derived from these).
CELL_KINDS = ("configuration", "action")

#: Version of the reward and profile table schemas, stored in every Parquet file's metadata
#: (``autoprofiler.schema``) and checked on read. 2: row ``kind`` and ``action`` columns instead of
#: ``action:<name>`` pseudo-configurations; provenance columns ``torch_version``, ``git_dirty``, ``worker``.
SCHEMA_VERSION = 2


def outcome_key(task_hash: str, configuration: str, rewriter: str, seed: int, round: int) -> str:
    """A stable string key for one (task, configuration, rewriter, seed, round) outcome.

    ``configuration`` is a canonical string: the sorted group names joined by ``+`` ("" for none).
    """
    raw = "\x1f".join([task_hash, configuration, rewriter, str(int(seed)), str(int(round))])
    return hashlib.sha256(raw.encode()).hexdigest()[:24]


def cell_key(task_hash: str, kind: str, configuration: str, action: str, rewriter: str, seed: int,
             round: int) -> str:
    """The reward-table key of a cell: ``outcome_key`` of its configuration, or of its action.

    An action cell is keyed as the configuration ``action:<name>`` was in schema 1, so keys (and every
    cache built on them) are the same in both schemas; the string lives only inside the hash.
    """
    if kind not in CELL_KINDS:
        raise ValueError(f"kind: expected one of {CELL_KINDS}, got {kind!r}")
    if kind == "action":
        if not action or configuration:
            raise ValueError(f"an action cell names an action and no configuration; got {action!r}, "
                             f"{configuration!r}")
        return outcome_key(task_hash, "action:" + action, rewriter, seed, round)
    return outcome_key(task_hash, configuration, rewriter, seed, round)


def configuration_name(groups) -> str:
    """Canonical name of a set of metric groups: sorted, joined by ``+``; ``""`` for none."""
    return "+".join(sorted(set(groups)))


# One row per evaluated cell: (task, kind, configuration or action, rewriter, seed, round).
REWARD_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("task_id", pa.string()),
        ("task_hash", pa.string()),
        ("level", pa.int32()),
        ("kind", pa.string()),  # CELL_KINDS
        ("configuration", pa.string()),  # groups shown ("" for none, and for action rows)
        ("policy", pa.string()),  # what asked for it: "static:<configuration>", "action", a policy name
        ("rewriter", pa.string()),
        ("seed", pa.int64()),
        ("round", pa.int32()),
        # outcome
        ("action", pa.string()),  # the action of an action row; a rule rewriter's choice otherwise
        ("candidate_hash", pa.string()),
        ("compiled", pa.bool_()),
        ("correct", pa.bool_()),
        ("error_kind", pa.string()),
        ("error", pa.string()),
        ("ref_ms", pa.float64()),
        ("new_ms", pa.float64()),
        ("speedup", pa.float64()),
        ("reward", pa.float64()),
        ("effective_speedup", pa.float64()),
        # costs
        ("profile_passes", pa.int64()),
        ("profile_seconds", pa.float64()),
        ("llm_calls", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("completion_tokens", pa.int64()),
        ("eval_seconds", pa.float64()),
        # provenance
        ("device", pa.string()),
        ("profile_source", pa.string()),
        ("driver", pa.string()),
        ("ncu_version", pa.string()),
        ("torch_version", pa.string()),
        ("git_sha", pa.string()),
        ("git_dirty", pa.bool_()),
        ("run_id", pa.string()),
        ("worker", pa.string()),
        ("created_at", pa.timestamp("s", tz="UTC")),
    ]
)
