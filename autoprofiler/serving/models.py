"""Request and response bodies of the HTTP service (pydantic): validated at the boundary.

Unknown fields are errors (``extra="forbid"``), numbers must be finite, and every failure answers 422
naming the field (``{"detail": "...", "errors": [{"field": "metrics.x", "message": "..."}]}``).
A task source is checked by parsing only (``autoprofiler.tasks.check_source``); it is never executed
in the Serve replica.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "JobAccepted",
    "JobState",
    "OptimizeOptions",
    "OptimizeRequest",
    "RouteAnswer",
    "RouteRequest",
    "TreeInfo",
]

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
HASH_PATTERN = r"^[0-9a-f]{16}$"
TASK_ID_PATTERN = r"^[A-Za-z0-9_.@/:+-]{1,200}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RouteRequest(_Strict):
    """``POST /route``: the task (its source, or its hash) and the metrics measured so far.

    ``metrics`` maps metric names (ncu names verbatim, or ``torch__...``) to finite numbers. With
    ``task_source`` the service checks it parses and defines ``Model``; ``task_hash`` (16 hex digits,
    ``autoprofiler.tasks.content_hash``) is echoed back; when both come they must agree.
    """

    task_source: str | None = Field(None, min_length=1)
    task_hash: str | None = Field(None, pattern=HASH_PATTERN)
    metrics: dict[str, FiniteFloat] = Field(default_factory=dict, max_length=4096)


class GroupCostModel(_Strict):
    group: str
    passes: int | None


class StepModel(_Strict):
    node: str
    feature: str
    value: float
    threshold: float
    went: Literal["left", "right"]


class RouteAnswer(_Strict):
    """``POST /route``'s answer: what to collect next, or the leaf and what the whole route costs."""

    tree: str = Field(description="the served tree's hash")
    task_hash: str
    done: bool = Field(description="a leaf is reached")
    node: str = Field(description="the node waiting for a metric, or the leaf")
    need: str | None = Field(description="the metric that node reads")
    collect: list[GroupCostModel] = Field(description="groups to collect now, with their replay passes")
    collect_passes: int
    path: list[StepModel]
    leaf: str | None
    groups: list[str] = Field(description="the leaf's groups: what the rewriter is shown")
    total: list[GroupCostModel] = Field(description="every group collected on the route (done only)")
    total_passes: int | None
    unknown_cost: list[str] = Field(description="groups of unknown pass cost (torch.profiler: free)")
    ignored_metrics: list[str] = Field(description="metrics no group of the tree yields")


class OptimizeOptions(_Strict):
    """How to optimize: the rewriter (the server's kind; default it), timing trials, evaluation seed."""

    rewriter: str | None = None
    trials: int | None = Field(None, ge=1, le=10_000)
    seed: int = Field(0, ge=0, le=2**31 - 1)


class OptimizeRequest(_Strict):
    """``POST /optimize``: a KernelBench-form task source (``class Model``, ``get_inputs``,
    ``get_init_inputs``), an optional id for the rows, and options."""

    task_source: str = Field(min_length=1)
    task_id: str | None = Field(None, pattern=TASK_ID_PATTERN)
    level: int = Field(1, ge=1, le=9)
    options: OptimizeOptions = Field(default_factory=OptimizeOptions)


class JobAccepted(_Strict):
    """``POST /optimize``'s answer (202): poll ``poll`` until ``status`` is ``done`` or ``failed``."""

    id: str
    status: str
    poll: str
    task_hash: str
    tree: str


class JobState(_Strict):
    """``GET /optimize/{id}``: the job's status and, when done, the outcome.

    ``status``: ``queued`` (waiting for a worker), ``running`` (on a worker), ``done`` (``result``
    holds the row: candidate source, correctness, speedup, groups, passes, seconds, key) or ``failed``
    (the machinery failed: ``error``; the HTTP status is 5xx).
    """

    id: str
    status: Literal["queued", "running", "done", "failed"]
    task_id: str
    task_hash: str
    tree: str
    submitted_at: float
    started_at: float | None = None
    finished_at: float | None = None
    result: dict[str, Any] | None = None
    error: str | None = None


class TreeInfo(_Strict):
    """``GET /tree`` (and a successful ``PUT /tree``): the served tree and where it came from."""

    hash: str
    policy: str
    source: str = Field(description="profile source of every group: ncu or torch")
    origin: str = Field(description="where the tree was loaded from")
    loaded_at: str
    budget: dict[str, int | None]
    leaves: list[str]
    tree: dict[str, Any]
    reload_error: str | None = Field(None, description="the last refused user_config reload, if any")
