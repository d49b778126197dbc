"""The HTTP API: a FastAPI app over a ``ServiceCore`` (the served tree and the optimize backend).

    GET  /healthz              liveness (no auth): the served tree's hash, whether /optimize is on
    GET  /tree                 the served tree: JSON, hash, policy, source, origin, budget
    PUT  /tree                 hot reload: the new tree's JSON (validated first; 422 and the old one
                               keeps serving when it does not load)
    POST /route                task (source or hash) + metrics so far -> what to collect next, or the leaf
    POST /optimize             task source + options -> 202 and a job id
    GET  /optimize/{id}        the job: queued, running, done (the row) or failed (5xx and the reason)

Every request but ``/healthz`` needs ``Authorization: Bearer <token>`` when the service has a token;
bodies over ``max_body_bytes`` get 413; invalid bodies get 422 naming the field. Submitted task code is
only parsed here (``ast``), never executed: profiling and evaluation happen on the workers.

``make_api`` works without Serve (e.g. under ``httpx.ASGITransport``); ``app.Service`` is the Serve
ingress that builds it in each replica.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from typing import Annotated, Any, Protocol

from fastapi import Body, FastAPI, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from autoprofiler.serving.models import (
    JobAccepted,
    JobState,
    OptimizeRequest,
    RouteAnswer,
    RouteRequest,
    TreeInfo,
)
from autoprofiler.serving.routing import ServedTree, load_served_tree, next_step
from autoprofiler.serving.settings import ServeSettings, resolve_path
from autoprofiler.tasks import Task, TaskLoadError, check_source, content_hash
from autoprofiler.tree import RouteError, TreeError

__all__ = ["OptimizeBackend", "ServiceCore", "make_api"]

logger = logging.getLogger(__name__)

OPEN_PATHS = ("/healthz",)


class OptimizeBackend(Protocol):
    """Where ``/optimize`` jobs go (``app.Optimizer`` through a Serve handle). Each answer is
    ``(http status, JSON body)``; ``state`` answers ``None`` for an unknown job."""

    async def submit(
        self, task: Task, served: ServedTree, seed: int, trials: int | None
    ) -> tuple[int, dict]: ...

    async def state(self, job_id: str) -> tuple[int, dict] | None: ...


class ServiceCore:
    """The service's state: settings, the served tree (hot-reloadable), the optimize backend.

    Args:
        settings: the service's settings (``settings.tree`` is loaded here).
        optimizer: the ``/optimize`` backend; ``None`` for a route-only service.
        identity: extra fields ``/healthz`` reports (e.g. the Serve replica id).
    """

    def __init__(
        self,
        settings: ServeSettings,
        optimizer: OptimizeBackend | None = None,
        identity: Mapping[str, Any] | None = None,
    ):
        self.settings = settings
        self.optimizer = optimizer
        self.identity = dict(identity or {})
        self.served = load_served_tree(settings.tree)
        self.source = self.served.tree.source  # the workers profile with it: a reload must keep it
        self.reload_error: str | None = None

    def reload(self, spec: str | Mapping[str, Any], origin: str) -> ServedTree:
        """Validate a new tree and serve it; on any problem raise ``TreeError`` and keep the old one."""
        served = load_served_tree(spec if isinstance(spec, Mapping) else resolve_path(spec), origin)
        if self.optimizer is not None and served.tree.source != self.source:
            problem = (
                f"source: this server's workers profile with {self.source!r}, got {served.tree.source!r}"
            )
            raise TreeError([problem], origin)
        self.served = served
        logger.info("serving tree %s from %s", served.hash, origin)
        return served

    def reconfigure(self, user_config: Mapping[str, Any] | None) -> None:
        """Serve's ``user_config`` hook: ``{"tree": path or JSON}`` reloads the tree.

        A tree that does not load is refused (logged, and reported as ``reload_error`` by ``GET /tree``)
        and the old one keeps serving; ``user_config`` keys other than ``tree`` are refused alike.
        """
        config = dict(user_config or {})
        unknown = sorted(set(config) - {"tree"})
        try:
            if unknown:
                raise TreeError([f"user_config: unknown key(s) {unknown} (expected: tree)"], "user_config")
            if "tree" in config:
                spec = config["tree"]
                self.reload(spec, f"user_config: {spec}" if isinstance(spec, str) else "user_config")
            self.reload_error = None
        except TreeError as exc:
            self.reload_error = str(exc)
            logger.error("user_config reload refused; still serving %s: %s", self.served.hash, exc)

    def tree_info(self) -> dict[str, Any]:
        return {**self.served.info(), "reload_error": self.reload_error}


def _error(status: int, detail: str, field: str | None = None, **extra: Any) -> JSONResponse:
    body: dict[str, Any] = {"detail": detail, **extra}
    if field is not None:
        body["errors"] = [{"field": field, "message": detail}]
    return JSONResponse(body, status_code=status)


def _field(loc: tuple | list) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "path", "query"):
        parts = parts[1:] or parts
    return ".".join(parts)


class BearerAuth:
    """ASGI middleware: every path but ``OPEN_PATHS`` needs ``Authorization: Bearer <token>``.

    Checked before the body is read or parsed, so an unauthenticated request learns nothing of the API.
    """

    def __init__(self, app, token: str | None):
        self.app = app
        self.expected = f"Bearer {token}".encode() if token else None

    async def __call__(self, scope, receive, send):
        if self.expected is None or scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, root = scope["path"], scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        given = dict(scope["headers"]).get(b"authorization", b"")
        if path in OPEN_PATHS or hmac.compare_digest(given, self.expected):
            return await self.app(scope, receive, send)
        reply = _error(401, "missing or wrong bearer token (Authorization: Bearer <token>)")
        reply.headers["www-authenticate"] = "Bearer"
        return await reply(scope, receive, send)


def make_api(core: ServiceCore) -> FastAPI:
    """The FastAPI app of ``core`` (see the module docstring)."""
    api = FastAPI(
        title="autoprofiler",
        summary="A learned profiling tree: what to profile next, or a profiled and rewritten candidate.",
        max_body_size=core.settings.max_body_bytes,  # larger bodies: 413, also when streamed
    )

    @api.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        errors = [
            {"field": "body", "message": f"{e['msg']} at character {e['loc'][-1]}"}
            if e["type"] == "json_invalid"
            else {"field": _field(e["loc"]), "message": e["msg"]}
            for e in exc.errors()
        ]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return JSONResponse({"detail": detail, "errors": errors}, status_code=422)

    @api.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {
            "status": "ok",
            "tree": core.served.hash,
            "optimize": core.optimizer is not None,
            **core.identity,
        }

    @api.get("/tree", response_model=TreeInfo)
    async def get_tree():
        return core.tree_info()

    @api.put("/tree", response_model=TreeInfo)
    async def put_tree(tree: Annotated[dict[str, Any], Body(description="the tree's JSON form")]):
        if not core.settings.admin:
            return _error(403, "hot reload over HTTP is off on this server (admin: false)")
        try:
            core.reload(tree, "PUT /tree")
        except TreeError as exc:
            return _error(422, str(exc), "tree", problems=exc.problems)
        return core.tree_info()

    @api.post("/route", response_model=RouteAnswer)
    async def route(request: RouteRequest):
        task_hash = request.task_hash
        if request.task_source is None and task_hash is None:
            return _error(422, "give task_source or task_hash", "task_source")
        if request.task_source is not None:
            problem = _source_problem(request.task_source)
            if problem:
                return _error(422, problem, "task_source")
            digest = content_hash(request.task_source)
            if task_hash is not None and task_hash != digest:
                return _error(422, f"task_hash {task_hash} is not the source's hash {digest}", "task_hash")
            task_hash = digest
        served = core.served
        try:
            step = next_step(served, request.metrics)
        except RouteError as exc:
            return _error(422, str(exc), "metrics")
        return JSONResponse({"tree": served.hash, "task_hash": task_hash, **step.as_dict()})

    @api.post("/optimize", status_code=202, response_model=JobAccepted)
    async def optimize(request: OptimizeRequest, http: Request):
        if core.optimizer is None:
            return _error(501, "this server runs no optimize workers (workers: 0); POST /route still works")
        options = request.options
        if options.rewriter is not None and options.rewriter != core.settings.rewriter:
            return _error(
                422,
                f"this server rewrites with {core.settings.rewriter!r}, got {options.rewriter!r}",
                "options.rewriter",
            )
        problem = _source_problem(request.task_source)
        if problem:
            return _error(422, problem, "task_source")
        digest = content_hash(request.task_source)
        task = Task.from_source(request.task_id or f"request/{digest}", request.task_source, request.level)
        try:
            status, body = await core.optimizer.submit(task, core.served, options.seed, options.trials)
        except Exception as exc:  # the optimizer deployment is down or restarting
            logger.warning("optimize backend unavailable: %s", exc)
            return _error(503, f"the optimize backend is unavailable ({type(exc).__name__}); retry")
        if "poll" in body:  # behind a route prefix the poll path starts with it
            body["poll"] = http.scope.get("root_path", "").rstrip("/") + body["poll"]
        return JSONResponse(body, status_code=status)

    @api.get("/optimize/{job_id}", response_model=JobState)
    async def job(job_id: Annotated[str, Path(pattern=r"^[0-9a-f]{32}$")]):
        if core.optimizer is None:
            return _error(501, "this server runs no optimize workers (workers: 0)")
        try:
            answer = await core.optimizer.state(job_id)
        except Exception as exc:
            logger.warning("optimize backend unavailable: %s", exc)
            return _error(503, f"the optimize backend is unavailable ({type(exc).__name__}); retry")
        if answer is None:
            return _error(404, f"no job {job_id} (unknown, or finished long ago and forgotten)", "job_id")
        status, body = answer
        return JSONResponse(body, status_code=status)

    api.add_middleware(BearerAuth, token=core.settings.token)
    return api


def _source_problem(source: str) -> str | None:
    """The loader's message when ``source`` does not parse or lacks the KernelBench names, else None."""
    try:
        check_source(source, origin="task_source")
    except TaskLoadError as exc:
        return exc.reason
    return None
