"""The Serve service over real HTTP on CPU (torch.profiler source, rule rewriter, tiny tasks).

One Ray (2 CPUs) and one Serve instance for the module, two applications: ``main`` at ``/`` (an
optimize worker, no token) and ``edge`` at ``/edge`` (route-only, a token, one request at a time and one
queued, a 4 KiB body limit) for auth, size limits and overload.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import yaml
from conftest import TINY_TASK_DIR, init_test_ray, load_tiny_task

from autoprofiler.serving import JobBoard, JobsFull, WorkerLost, settings_from_args
from autoprofiler.serving.settings import REPO, SettingsError, check_binding
from autoprofiler.tree import load_tree

ray = pytest.importorskip("ray")
httpx = pytest.importorskip("httpx")
from ray import serve  # noqa: E402

from autoprofiler.serving.app import build  # noqa: E402

SEED_TREE = REPO / "trees" / "seed_torch.json"
TOKEN = "test-token-1234"
EVAL = {"timing_trials": 3, "warmup": 1, "correctness_trials": 1, "timeout_s": 120.0}
EDGE_LIMITS = {"max_ongoing_requests": 1, "max_queued_requests": 1}
AUTH = {"Authorization": f"Bearer {TOKEN}"}
HASH = "0123456789abcdef"  # a well-formed task hash (/route echoes it)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tree_data(threshold: float = 0.5) -> dict:
    """The seed torch tree with the root's threshold set (0.5 is the seed's own)."""
    data = json.loads(SEED_TREE.read_text())
    data["nodes"][0]["threshold"] = threshold
    data["provenance"]["name"] = f"seed_torch_t{threshold}"
    return data


EDGE_ARGS = {"workers": 0, "token": TOKEN, "max_body_bytes": 4096}


def _deploy(port: int, main_args: dict, edge_user_config: dict | None = None) -> None:
    """Deploy both apps from a config, as ``serve run`` / ``serve deploy`` do (the app builder named by
    ``import_path`` and its ``args``); a changed ``user_config`` alone is applied in place."""
    from ray.serve._private.api import _get_global_client  # what `serve run CONFIG` calls
    from ray.serve.schema import ServeDeploySchema

    edge_service = {"name": "Service", **EDGE_LIMITS}
    if edge_user_config is not None:
        edge_service["user_config"] = edge_user_config
    app = {"import_path": "autoprofiler.serving.app:build"}
    config = {
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [
            {**app, "name": "main", "route_prefix": "/", "args": main_args},
            {
                **app,
                "name": "edge",
                "route_prefix": "/edge",
                "args": EDGE_ARGS,
                "deployments": [edge_service],
            },
        ],
    }
    _get_global_client().deploy_apps(ServeDeploySchema.model_validate(config), _blocking=True)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """Ray and Serve on a free loopback port with the ``main`` and ``edge`` apps; yields the base URL."""
    init_test_ray()
    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    cache = str(tmp_path_factory.mktemp("profile-cache"))
    main_args = {"eval": EVAL, "profile_cache": cache, "max_jobs": 4}
    try:
        _deploy(port, main_args)
        yield {"url": f"http://127.0.0.1:{port}", "port": port, "main_args": main_args}
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def client(service):
    with httpx.Client(base_url=service["url"], timeout=60) as c:
        yield c


def _wait_job(client, job_id: str, until=("done", "failed"), timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = client.get(f"/optimize/{job_id}")
        if r.json().get("status") in until:
            return r
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} not {until} after {timeout} s: {r.json()}")


# --- health, tree, route ------------------------------------------------------------------------------
def test_healthz_and_tree_describe_the_served_tree(client):
    """/healthz answers without auth; /tree gives the JSON, its hash, profile source, origin and budget."""
    health = client.get("/healthz").json()
    tree = client.get("/tree").json()
    seed = load_tree(SEED_TREE)
    assert health["status"] == "ok" and health["optimize"] is True and health["tree"] == seed.fingerprint()
    assert tree["hash"] == seed.fingerprint() and tree["source"] == "torch"
    assert tree["origin"] == str(SEED_TREE) and tree["budget"] == {
        "max_depth": 4,
        "max_groups_per_leaf": 4,
        "max_passes_per_task": None,
    }
    assert tree["tree"]["nodes"] == json.loads(SEED_TREE.read_text())["nodes"]
    assert tree["reload_error"] is None


def test_route_walks_the_seed_tree_one_node_at_a_time(client):
    """From nothing to the 'compute' leaf: the root asks for torch_root, n1 reads its matmul share from
    the same group, and the leaf adds torch_flops (torch groups have no pass cost)."""
    source = (TINY_TASK_DIR / "matmul.py").read_text()
    first = client.post("/route", json={"task_source": source}).json()
    assert (first["done"], first["node"], first["need"]) == (False, "n0", "torch__elementwise_time_share")
    assert first["collect"] == [{"group": "torch_root", "passes": None}] and first["path"] == []
    assert first["task_hash"] == load_tiny_task("matmul").hash
    metrics = {"torch__elementwise_time_share": 0.0, "torch__matmul_time_share": 1.0, "made_up": 3.0}
    last = client.post("/route", json={"task_hash": first["task_hash"], "metrics": metrics}).json()
    assert (last["done"], last["leaf"], last["groups"]) == (True, "compute", ["torch_root", "torch_flops"])
    assert last["collect"] == [{"group": "torch_flops", "passes": None}]
    assert [(s["node"], s["went"]) for s in last["path"]] == [("n0", "left"), ("n1", "right")]
    assert last["total_passes"] == 0 and last["unknown_cost"] == ["torch_root", "torch_flops"]
    assert last["ignored_metrics"] == ["made_up"]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"metrics": {}}, "task_source"),
        ({"task_source": "class Model:\n    pass\n"}, "task_source"),  # no get_inputs
        ({"task_source": "def broken(:\n"}, "task_source"),
        ({"task_source": "x = 1\n"}, "task_source"),
        ({"task_hash": "not-a-hash"}, "task_hash"),
        ({"task_hash": HASH, "metrics": {"torch__op_count": "many"}}, "metrics.torch__op_count"),
        ({"task_hash": HASH, "colour": "blue"}, "colour"),
        ({"task_source": (TINY_TASK_DIR / "matmul.py").read_text(), "task_hash": HASH}, "task_hash"),
        ([1, 2], "body"),
    ],
)
def test_route_bad_input_gets_422_naming_the_field(client, body, field):
    """Each invalid /route body answers 422 and names the offending field."""
    r = client.post("/route", json=body)
    assert r.status_code == 422, r.text
    assert field in [e["field"] for e in r.json()["errors"]], r.json()


def test_route_rejects_non_json_and_non_finite_numbers(client):
    """Malformed JSON and NaN metrics are 422 too (naming the body and the metric)."""
    bad = client.post("/route", content=b'{"task_hash": ', headers={"content-type": "application/json"})
    nan = client.post(
        "/route",
        content=b'{"task_hash": "0123456789abcdef", "metrics": {"torch__op_count": NaN}}',
        headers={"content-type": "application/json"},
    )
    assert (bad.status_code, bad.json()["errors"][0]["field"]) == (422, "body")
    assert (nan.status_code, nan.json()["errors"][0]["field"]) == (422, "metrics.torch__op_count")


def test_a_task_without_model_gets_the_loaders_message(client):
    """A source with get_inputs but no Model: 422 with autoprofiler.tasks.check_source's reason."""
    source = "def get_inputs():\n    return []\n\ndef get_init_inputs():\n    return []\n"
    r = client.post("/route", json={"task_source": source})
    assert r.status_code == 422 and "missing class Model" in r.json()["detail"]


# --- auth, body size, overload (edge app) -------------------------------------------------------------
def test_the_token_is_required_everywhere_but_healthz(service):
    """On a service with a token: no header or a wrong one is 401; the right one works; /healthz is open."""
    with httpx.Client(base_url=f"{service['url']}/edge", timeout=30) as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/tree").status_code == 401
        assert c.get("/tree", headers={"Authorization": "Bearer wrong-token"}).status_code == 401
        r = c.post("/route", json={"task_hash": HASH})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert c.get("/tree", headers=AUTH).status_code == 200
        assert c.post("/optimize", headers=AUTH, json={"task_source": "x"}).status_code in (422, 501)


def test_bodies_over_the_limit_get_413(service):
    """A body over max_body_bytes is refused, with a Content-Length or streamed without one."""
    big = {"task_hash": HASH, "metrics": {f"m{i}": 1.0 for i in range(400)}}
    with httpx.Client(base_url=f"{service['url']}/edge", timeout=30, headers=AUTH) as c:
        assert c.post("/route", json=big).status_code == 413
        streamed = c.post("/route", content=iter([b"{" + b" " * 3000, b" " * 3000 + b"}"]))
        assert streamed.status_code == 413
        assert c.post("/route", json={"task_hash": HASH}).status_code == 200


def test_overload_answers_503_quickly_and_the_service_recovers(service):
    """Edge takes one request and queues one: with two slow uploads holding both places, the next
    request is refused with 503 at once; once they finish, requests are answered again."""
    release = threading.Event()
    url = f"{service['url']}/edge/route"
    held: list[int] = []

    def slow_body():
        yield b'{"task_hash": "0123456789abcdef",'
        release.wait(30)
        yield b' "metrics": {}}'

    def hold():
        headers = {**AUTH, "content-type": "application/json"}
        held.append(httpx.post(url, content=slow_body(), headers=headers, timeout=60).status_code)

    threads = [threading.Thread(target=hold) for _ in range(2)]
    try:
        for t in threads:
            t.start()
            time.sleep(0.3)
        refused = None
        for _ in range(50):  # both places fill within a moment; until then a probe may get through
            start = time.monotonic()
            r = httpx.post(url, json={"task_hash": HASH}, headers=AUTH, timeout=30)
            if r.status_code == 503:
                refused = time.monotonic() - start
                break
            time.sleep(0.1)
    finally:
        release.set()
        for t in threads:
            t.join(60)
    assert refused is not None and refused < 5.0
    assert held.count(200) >= 1 and set(held) <= {200, 503}
    after = httpx.post(url, json={"task_hash": HASH}, headers=AUTH, timeout=30)
    assert after.status_code == 200


# --- hot reload -------------------------------------------------------------------------------------
def test_put_tree_reloads_and_an_invalid_tree_is_refused(client):
    """PUT /tree swaps the tree without a restart (same replica, new hash, new routes); an invalid tree
    gets 422 with the loader's problems and the previous tree keeps serving."""
    metrics = {"torch__elementwise_time_share": 0.2, "torch__matmul_time_share": 1.0}
    replica = client.get("/healthz").json()["replica"]
    before = client.post("/route", json={"task_hash": HASH, "metrics": metrics}).json()
    assert before["leaf"] == "compute"
    try:
        new = client.put("/tree", json=_tree_data(threshold=0.1))
        assert new.status_code == 200 and new.json()["origin"] == "PUT /tree"
        routed = client.post("/route", json={"task_hash": HASH, "metrics": metrics}).json()
        assert routed["leaf"] == "memory" and routed["tree"] == new.json()["hash"]
        broken = _tree_data()
        broken["nodes"][0]["children"]["left"] = "n9"
        refused = client.put("/tree", json=broken)
        assert refused.status_code == 422
        assert "nodes[0].children.left: node 'n9' does not exist" in refused.json()["problems"]
        ncu = client.put("/tree", json=json.loads((REPO / "trees" / "seed.json").read_text()))
        assert ncu.status_code == 422 and "profile with 'torch'" in ncu.json()["detail"]
        assert client.get("/tree").json()["hash"] == new.json()["hash"]
        assert client.get("/healthz").json()["replica"] == replica
    finally:
        client.put("/tree", json=json.loads(SEED_TREE.read_text()))


def test_user_config_reloads_in_place_and_keeps_the_old_tree_when_invalid(service, tmp_path):
    """A new user_config tree is applied by Service.reconfigure on the same replica (no restart); an
    invalid one is refused (reported as reload_error) and the previous tree keeps serving."""
    good = tmp_path / "t01.json"
    good.write_text(json.dumps(_tree_data(threshold=0.1)))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with httpx.Client(base_url=f"{service['url']}/edge", timeout=30, headers=AUTH) as c:
        replica = c.get("/healthz").json()["replica"]
        _deploy(service["port"], service["main_args"], {"tree": str(good)})
        info = _wait_tree(c, lambda i: i["hash"] == load_tree(good).fingerprint())
        assert info["origin"] == f"user_config: {good}" and info["reload_error"] is None
        _deploy(service["port"], service["main_args"], {"tree": str(bad)})
        info = _wait_tree(c, lambda i: i["reload_error"] is not None)
        assert "not valid JSON" in info["reload_error"] and info["hash"] == load_tree(good).fingerprint()
        assert c.get("/healthz").json()["replica"] == replica


def _wait_tree(c, predicate, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = c.get("/tree").json()
        if predicate(info):
            return info
        time.sleep(0.2)
    raise AssertionError(f"the served tree did not change in {timeout} s: {info['origin']}")


# --- optimize -----------------------------------------------------------------------------------------
def test_optimize_profiles_rewrites_and_evaluates_on_a_worker(client):
    """POST /optimize answers a job id at once; the job ends with the row: candidate source, correctness,
    speedup, the leaf's groups, profiling cost and the reward-table key of the cell."""
    from autoprofiler.cells import Cell
    from autoprofiler.rewriters.rule import RuleRewriter

    task = load_tiny_task("matmul")
    body = {"task_source": task.source, "task_id": task.id, "options": {"trials": 3}}
    r = client.post("/optimize", json=body)
    assert r.status_code == 202 and r.json()["status"] in ("queued", "running"), r.text
    assert r.json()["poll"] == f"/optimize/{r.json()['id']}"
    done = _wait_job(client, r.json()["id"])
    assert done.status_code == 200 and done.json()["status"] == "done", done.text
    result = done.json()["result"]
    assert result["task"] == task.id and result["leaf"] == "compute" and not result["failed"]
    assert result["groups"] == "torch_root+torch_flops" and result["profile_seconds"] > 0
    assert (
        result["compiled"]
        and isinstance(result["correct"], bool)
        and "class ModelNew" in (result["candidate_source"])
    )
    cell = Cell(task, ("torch_root", "torch_flops"), RuleRewriter().identity, 0)
    assert result["key"] == cell.key and result["policy"].startswith("tree:seed_torch@")


def test_optimize_bad_input_and_unknown_jobs(client, service):
    """Bad /optimize bodies are 422 naming the field; unknown job ids 404; a route-only server 501."""
    source = (TINY_TASK_DIR / "matmul.py").read_text()
    cases = [
        ({"task_source": source, "options": {"rewriter": "openai"}}, "options.rewriter"),
        ({"task_source": source, "options": {"trials": 0}}, "options.trials"),
        ({"task_source": "class Model: pass\n"}, "task_source"),
        ({"task_source": source, "task_id": "no spaces allowed"}, "task_id"),
        ({"source": source}, "task_source"),
    ]
    for body, field in cases:
        r = client.post("/optimize", json=body)
        assert r.status_code == 422 and field in [e["field"] for e in r.json()["errors"]], (body, r.text)
    assert client.get("/optimize/" + "0" * 32).status_code == 404
    assert client.get("/optimize/nope").status_code == 422
    edge = httpx.post(
        f"{service['url']}/edge/optimize", json={"task_source": source}, headers=AUTH, timeout=30
    )
    assert edge.status_code == 501


def test_a_worker_killed_mid_request_gives_502_and_the_next_request_works(client):
    """SIGKILL the GpuWorker while a job runs on it: the job fails with 502 and the reason; Ray restarts
    the worker and the next job completes."""
    optimizer = serve.get_deployment_handle("Optimizer", app_name="main")
    pid = optimizer.workers.remote().result()[0]["pid"]
    task = load_tiny_task("tiny_softmax")
    r = client.post("/optimize", json={"task_source": task.source, "options": {"trials": 3}})
    job_id = r.json()["id"]
    _wait_job(client, job_id, until=("running", "done", "failed"))
    os.kill(pid, signal.SIGKILL)
    failed = _wait_job(client, job_id)
    assert failed.status_code == 502 and failed.json()["status"] == "failed", failed.text
    assert "died mid-request" in failed.json()["error"]
    again = load_tiny_task("matmul")  # profiled by the earlier test: its profile comes from the disk cache
    r = client.post("/optimize", json={"task_source": again.source, "options": {"trials": 3}})
    done = _wait_job(client, r.json()["id"])
    assert done.status_code == 200 and done.json()["status"] == "done", done.text
    assert optimizer.workers.remote().result()[0]["pid"] != pid


# --- pieces without Serve -----------------------------------------------------------------------------
def test_job_board_bounds_pending_jobs_and_maps_failures():
    """JobBoard: max_jobs pending at once (JobsFull beyond), a lost worker is 502, any other error 500."""
    from autoprofiler.optimize import Optimized

    task = load_tiny_task("matmul")
    tree = load_tree(SEED_TREE)

    async def scenario():
        gate = asyncio.Event()

        async def run(job):
            await gate.wait()
            if job.seed == 1:
                raise WorkerLost("worker 0 died mid-request")
            if job.seed == 2:
                raise RuntimeError("boom")
            return Optimized(task, None, "task_error: the reference crashed")

        board = JobBoard(run, capacity=1, max_jobs=3, keep_jobs=2)
        jobs = [board.submit(task, tree, "h", seed=s) for s in (0, 1, 2)]
        with pytest.raises(JobsFull):
            board.submit(task, tree, "h")
        await asyncio.sleep(0)
        states = [j.status for j in jobs]
        gate.set()
        while board.pending:
            await asyncio.sleep(0.01)
        return states, jobs, board

    states, jobs, board = asyncio.run(scenario())
    assert states == ["running", "queued", "queued"]
    assert [(j.status, j.http_status) for j in jobs] == [("done", 200), ("failed", 502), ("failed", 500)]
    assert jobs[0].result["failed"] and jobs[0].result["error"].startswith("task_error")
    assert board.get(jobs[0].id) is None and board.get(jobs[2].id) is jobs[2]  # keep_jobs=2


def test_settings_report_every_problem_and_refuse_public_hosts_without_a_token():
    """settings_from_args names each bad key at once; a non-loopback host needs a token."""
    with pytest.raises(SettingsError) as err:
        settings_from_args({"workers": -1, "device": "tpu", "colour": 1, "tree": "trees/none.json"})
    text = str(err.value)
    for part in ("workers:", "device:", "colour: unknown key", "tree:"):
        assert part in text
    check_binding("127.0.0.1", None)
    check_binding("0.0.0.0", TOKEN)
    with pytest.raises(SettingsError, match="not a loopback address"):
        check_binding("0.0.0.0", None)


def test_serve_config_validates_and_builds_the_app():
    """serve_config.yaml passes Serve's schema and its app builder builds with the config's args; its
    deployment names exist in the app."""
    from ray.serve.schema import ServeDeploySchema

    config = yaml.safe_load((REPO / "serve_config.yaml").read_text())
    ServeDeploySchema.model_validate(config) if hasattr(ServeDeploySchema, "model_validate") else (
        ServeDeploySchema.parse_obj(config)
    )
    (application,) = config["applications"]
    assert application["import_path"] == "autoprofiler.serving.app:build"
    app = build(copy.deepcopy(application["args"]))
    names = {"Service", "Optimizer"} if application["args"].get("workers", 1) else {"Service"}
    assert {d["name"] for d in application.get("deployments", [])} <= names
    assert type(app).__name__ == "Application"


def test_workflow_refuses_a_public_host_without_a_token_and_bad_keys():
    """workflows/serve.py exits 2 with one line for a non-loopback host without a token and for bad keys."""
    env = {k: v for k, v in os.environ.items() if k != "AUTOPROFILER_SERVE_TOKEN"}
    script = str(REPO / "workflows" / "serve.py")
    public = subprocess.run([sys.executable, script, "host=0.0.0.0"], capture_output=True, text=True, env=env)
    bad = subprocess.run([sys.executable, script, "workers=lots"], capture_output=True, text=True, env=env)
    assert public.returncode == 2 and "not a loopback address" in public.stderr
    assert bad.returncode == 2 and "workers: expected int" in bad.stderr
