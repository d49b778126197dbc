"""ExperienceRewriter: the action that worked best on the most similar *training* tasks.

Fit on training rows of a recording: each training task's profile (every group recorded) and the
effective speedup of each action evaluated on it. Shown a profile, it compares it with every training
task's profile *restricted to the same groups*, on the task-level metrics of those groups only, takes
the ``k`` nearest and picks the action with the best mean log effective speedup over them. So the groups
it is shown decide what "similar" means: more groups can sharpen the neighbourhood or, with metrics that
do not bear on the outcome, mislead it (what the paper reports for LLMs shown more profile).

Similarity: each metric ``x`` becomes ``sign(x) log(1 + |x|)`` (counts, bytes and durations span orders of
magnitude), is divided by its spread (standard deviation) over the training tasks, and the distance is the
root mean square difference over the metrics both profiles hold; a training task lacking a shown group
is not a candidate neighbour. Ties go to the lower task hash, so decisions are deterministic. Blind (no
profile): the action with the best mean over all training tasks (the best static action).

Held-out tasks' rewards are never seen: ``from_recording`` keeps only the tasks of the tuning split
(``split.is_tuning_task``) unless told otherwise, and ``identity`` carries a digest of the training
tasks and ``k``, so configuration rows of differently fitted rewriters never mix. On a training task
itself the nearest neighbour is that task (distance 0): its decisions there are in-sample, unless
``leave_one_out`` leaves the shown task out of its own neighbours (blind stays the best action over
every training task).

Example::

    rewriter = ExperienceRewriter.from_recording("datasets/h200_suite")     # tuning tasks only
    rewriter.decide(profile.restrict(["memory"]))        # ('torch_compile', 'nearest training tasks: ...')
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autoprofiler.rewriters.actions import (
    ACTIONS,
    ACTIONS_VERSION,
    RULE_ACTIONS,
    FixedAction,
    action_rewrite,
    build_source,
)
from autoprofiler.rewriters.base import Rewrite
from autoprofiler.rewriters.evidence import number
from autoprofiler.rewriters.split import is_tuning_task

if TYPE_CHECKING:
    from autoprofiler.profiling.profile import Profile

EXPERIENCE_VERSION = "experience-v1"


@dataclass(frozen=True)
class Experience:
    """One training task: its profile (every recorded group) and each evaluated action's outcome.

    Attributes:
        task_hash, task_id: the task.
        profile: the merged profile of all its recorded groups.
        outcomes: action -> effective speedup (1.0 for a wrong candidate: the original is kept).
    """

    task_hash: str
    task_id: str
    profile: Profile
    outcomes: dict[str, float]


def _squash(value: float) -> float:
    return math.copysign(math.log1p(abs(value)), value)


def _recorded_for_every_task(experience: Sequence[Experience]) -> list[str]:
    """The catalog's actions every training task has an outcome for, in catalog order."""
    return [a for a in ACTIONS if all(a in e.outcomes for e in experience)]


def _features(profile: Profile) -> dict[str, float]:
    """The profile's task-level metrics, squashed (``derived__*`` included: they are the group's)."""
    out = {}
    for name, value in (profile.metrics or {}).items():
        v = number(value)
        if v is not None and math.isfinite(v):
            out[name] = _squash(v)
    return out


class ExperienceRewriter:
    """Nearest training tasks by the shown groups' metrics -> their best action (module docstring).

    Parameters:
        experience: the training tasks (at least one; each with at least one outcome).
        k: neighbours to average over (default 3).
        source: the profile source it answers (``"ncu"`` or ``"torch"``); another source is blind.
        leave_one_out: shown a training task's own profile, leave that task out of its neighbours, so
            its decisions on training tasks are out of sample as on any other task (what a learner
            scoring proposals on the training tasks needs); named in ``identity`` as ``loo``.
        actions: choose only among these (default: every action some training task has an outcome
            for). A replay answers only recorded actions, so a replayed run fits with
            ``from_recording(..., common_actions_only=True)``. Named in ``identity`` when given.
    """

    def __init__(
        self,
        experience: Sequence[Experience],
        k: int = 3,
        source: str = "ncu",
        leave_one_out: bool = False,
        actions: Sequence[str] | None = None,
    ):
        if not experience:
            raise ValueError("expected at least one training task (Experience); got none")
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k: expected an integer >= 1, got {k!r}")
        unknown = sorted({a for e in experience for a in e.outcomes if a not in ACTIONS})
        if unknown:
            raise ValueError(f"outcomes name actions outside the catalog: {unknown}")
        self.experience = sorted(experience, key=lambda e: e.task_hash)
        self.k = k
        self.source = source
        self.leave_one_out = bool(leave_one_out)
        self._features = {e.task_hash: _features(e.profile) for e in self.experience}
        if actions is not None and not set(actions) <= set(ACTIONS):
            raise ValueError(f"actions outside the catalog: {sorted(set(actions) - set(ACTIONS))}")
        allowed = set(ACTIONS) if actions is None else set(actions)
        self._actions = [a for a in ACTIONS if a in allowed and any(a in e.outcomes for e in self.experience)]
        if not self._actions:
            raise ValueError(f"no training task has an outcome for any of the actions {sorted(allowed)}")
        named = [] if actions is None else ["actions", *self._actions]
        digest = hashlib.sha256(
            "\x1f".join([source, str(k), *(e.task_hash for e in self.experience), *named]).encode()
        ).hexdigest()[:8]
        train = f"{len(self.experience)}:{digest}" + (",loo" if self.leave_one_out else "")
        if actions is not None:
            train += f",actions={len(self._actions)}"
        self.identity = f"{EXPERIENCE_VERSION}[k={k},source={source},train={train}]"
        self.actions_identity = ACTIONS_VERSION
        self._spread = self._spreads()
        self._group_names: dict[frozenset[str], frozenset[str]] = {}

    @classmethod
    def from_recording(
        cls,
        recording: str | Path | Sequence[str | Path] = "datasets/h200_suite",
        k: int = 3,
        source: str = "ncu",
        train: Callable[[str], bool] = is_tuning_task,
        leave_one_out: bool = False,
        common_actions_only: bool = False,
    ) -> ExperienceRewriter:
        """Fit on the action rows and profiles of ``recording`` (one folder, or several read together,
        e.g. the recordings of two cards) for the tasks ``train(task_hash)`` keeps (default: the tuning
        split). ``common_actions_only``: choose among ``common_actions()`` only, what a replay of tasks
        recorded like these can answer. A task without a row for every rule action (``RULE_ACTIONS``,
        which a recording makes for every task) is one still being recorded and is left out: fitted on,
        its few outcomes would narrow ``common_actions()`` to them. Raises
        ``FileNotFoundError``/``ValueError`` naming what is missing."""
        from autoprofiler.profiling.cache import profile_from_record
        from autoprofiler.tables import ProfileTable, RewardTable

        roots = [Path(recording)] if isinstance(recording, str | Path) else [Path(r) for r in recording]
        for root in roots:
            for sub in ("profiles", "rewards"):
                if not (root / sub).is_dir():
                    raise FileNotFoundError(f"expected a recording with {sub}/ under {root}; it is not there")
        outcomes: dict[str, dict[str, float]] = {}
        names: dict[str, str] = {}
        for row in RewardTable(None, read_from=[r / "rewards" for r in roots]).rows():
            if row.kind != "action" or row.rewriter != ACTIONS_VERSION or row.seed or row.round:
                continue
            if not train(row.task_hash) or row.action not in ACTIONS:
                continue
            outcomes.setdefault(row.task_hash, {})[row.action] = float(row.effective_speedup)
            names[row.task_hash] = row.task_id
        for task_hash in [h for h, by_action in outcomes.items() if not set(RULE_ACTIONS) <= set(by_action)]:
            del outcomes[task_hash]  # still being recorded: its few actions would narrow common_actions()
        profiles = ProfileTable(None, read_from=[r / "profiles" for r in roots])
        experience = []
        for task_hash in sorted(outcomes):
            records = profiles.groups_for(task_hash, source)
            merged = None
            for group in sorted(records):
                if not records[group]["profile_json"]:
                    continue
                part = profile_from_record(records[group])
                merged = part if merged is None else merged.merge(part)
            if merged is not None:
                experience.append(Experience(task_hash, names[task_hash], merged, outcomes[task_hash]))
        if not experience:
            raise ValueError(
                f"no training task with a {source} profile and action rows in {', '.join(map(str, roots))}"
            )
        actions = _recorded_for_every_task(experience) if common_actions_only else None
        return cls(experience, k=k, source=source, leave_one_out=leave_one_out, actions=actions)

    def common_actions(self) -> list[str]:
        """The actions *every* training task has an outcome for, in catalog order.

        A recording holds the rule actions for every task but a further action (one of the playbook's,
        recorded only where the playbook reaches it) for some: fitted on those too, the neighbours of a
        task lacking it can choose it, and a replay has no outcome to answer with.
        """
        return [a for a in _recorded_for_every_task(self.experience) if a in self._actions]

    def with_actions(self, actions: Sequence[str]) -> ExperienceRewriter:
        """The same fit choosing only among ``actions`` (e.g. ``common_actions()`` for a replay)."""
        return ExperienceRewriter(
            self.experience, k=self.k, source=self.source, leave_one_out=self.leave_one_out, actions=actions
        )

    # --- the ActionRewriter protocol ------------------------------------------------------------------
    def actions(self) -> list[str]:
        """The actions it chooses among: those some training task has an outcome for (and ``actions``
        keeps), in catalog order."""
        return list(self._actions)

    def source_for(self, task, action: str) -> str:
        return build_source(task.source, action)

    def for_action(self, action: str) -> FixedAction:
        return FixedAction(self, action)

    def decide(self, profile: Profile | None) -> tuple[str, str]:
        """``(action, reason)``: the best action over the nearest training tasks by the shown metrics."""
        if profile is None or profile.source != self.source or not profile.groups:
            action, mean = self._best(self.experience)
            return (
                action,
                f"blind: the best action over all {len(self.experience)} training tasks ({mean:.2f}x)",
            )
        shown = _features(profile)
        names = self._names(profile.groups)
        ranked = []
        for e in self.experience:
            if not profile.groups <= e.profile.groups:
                continue
            if self.leave_one_out and e.task_hash == profile.task_hash:
                continue
            theirs = self._features[e.task_hash]  # restricted to the shown groups' names below
            common = [n for n in shown if n in names and n in theirs and self._spread.get(n, 0.0) > 0]
            if not common:
                continue
            d = math.sqrt(sum(((shown[n] - theirs[n]) / self._spread[n]) ** 2 for n in common) / len(common))
            ranked.append((d, e.task_hash, e))
        if not ranked:
            action, mean = self._best(self.experience)
            return action, (
                f"no training task holds the shown groups ({', '.join(sorted(profile.groups))}): the best "
                f"action over all training tasks ({mean:.2f}x)"
            )
        ranked.sort(key=lambda item: (item[0], item[1]))
        near = [e for _, _, e in ranked[: self.k]]
        action, mean = self._best(near)
        which = ", ".join(f"{e.task_id} (d={d:.2f})" for d, _, e in ranked[: self.k])
        return action, f"nearest training tasks: {which}; best mean action {action} ({mean:.2f}x geomean)"

    def rewrite(self, task, profile) -> Rewrite:
        return action_rewrite(self, task, *self.decide(profile))

    # --- internals ------------------------------------------------------------------------------------
    def _names(self, groups: frozenset[str]) -> frozenset[str]:
        """The metric names of ``groups`` (cached: a replay asks for the same subsets many times)."""
        from autoprofiler.profiling.groups import group_metrics

        if groups not in self._group_names:
            self._group_names[groups] = frozenset(group_metrics(sorted(groups)))
        return self._group_names[groups]

    def _best(self, tasks: Sequence[Experience]) -> tuple[str, float]:
        """The action with the best mean log effective speedup over ``tasks`` (those recording it all)."""
        best, best_score = "keep", -math.inf
        for action in self._actions:
            values = [e.outcomes[action] for e in tasks if action in e.outcomes]
            if len(values) != len(tasks):
                continue
            score = sum(math.log(max(v, 1e-9)) for v in values) / len(values)
            if score > best_score + 1e-12:
                best, best_score = action, score
        return best, math.exp(best_score) if best_score > -math.inf else 1.0

    def _spreads(self) -> dict[str, float]:
        """Standard deviation of each squashed metric over the training tasks that hold it."""
        values: dict[str, list[float]] = {}
        for features in self._features.values():
            for name, value in features.items():
                values.setdefault(name, []).append(value)
        spread = {}
        for name, xs in values.items():
            if len(xs) < 2:
                continue
            mean = sum(xs) / len(xs)
            spread[name] = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
        return spread
