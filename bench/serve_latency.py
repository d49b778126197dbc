"""python bench/serve_latency.py --out bench/results/serve_latency.md

Latency and throughput of the Serve service on loopback, and where the time goes:

1. ``/route`` in this process: ``routing.next_step`` alone, and the whole ASGI app (auth, FastAPI,
   pydantic, JSON) called directly, without a network.
2. ``/route`` over HTTP under a bounded concurrent load of 1, 10 and 100 clients (aiohttp, one event
   loop, each client posting as soon as its answer came) for ``--seconds`` each: p50/p90/p99/max
   latency, requests per second, non-200 answers, and the CPU milliseconds per request (user, system)
   of the proxy, HAProxy, the ``Service`` replica and the load generator, read from ``/proc``. Three
   ingresses: ``uvicorn`` (the same ASGI app in one plain uvicorn process: no Serve, the floor),
   ``proxy`` (Serve's default Python HTTP proxy -> replica) and ``haproxy``
   (``RAY_SERVE_ENABLE_HA_PROXY=1 RAY_SERVE_THROUGHPUT_OPTIMIZED=1``: HAProxy -> the replica's own
   HTTP server). Serve runs the route-only app with ``serve_config.yaml``'s ``Service`` limits.
3. ``/optimize`` throughput on CPU: ``--jobs`` suite tasks submitted at once to one worker (torch
   profiler, rule rewriter, ``serve_config.yaml``'s args); jobs per minute, queue wait and run time
   per job, profiling and evaluation seconds.

Each ingress runs in a child process (Ray reads its Serve flags from the environment at start).
Writes Markdown (``--out``) and JSON beside it. Linux only (``/proc``); the machine's load average is
recorded before and after each level, since other processes on the 2 CPUs change the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from autoprofiler.serving import load_served_tree, next_step, settings_from_args  # noqa: E402
from autoprofiler.serving.api import ServiceCore, make_api  # noqa: E402

SEED = ROOT / "trees" / "seed_torch.json"
TASK_HASH = "0123456789abcdef"
#: Bodies that end at each of the seed tree's leaves, and one that stops at the root.
_ELEMENTWISE, _MATMUL, _LAUNCH = (
    "torch__elementwise_time_share",
    "torch__matmul_time_share",
    "torch__launch_overhead_share",
)
BODIES = [
    {"task_hash": TASK_HASH, "metrics": {_ELEMENTWISE: 0.9}},
    {"task_hash": TASK_HASH, "metrics": {_ELEMENTWISE: 0.1, _MATMUL: 0.9}},
    {"task_hash": TASK_HASH, "metrics": {_ELEMENTWISE: 0.1, _MATMUL: 0.1, _LAUNCH: 0.5}},
    {"task_hash": TASK_HASH, "metrics": {}},
]
OPTIMIZE_TASKS = ["relu", "softmax_rows", "layernorm", "sum_rows", "matvec", "transpose_copy", "tiny_add"]


def percentile(xs: list[float], p: int) -> float:
    """Linear-interpolation percentile (as numpy's default), ``p`` in 1..99."""
    return statistics.quantiles(xs, n=100, method="inclusive")[p - 1]


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- CPU accounting from /proc ------------------------------------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process and its reaped children's threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK  # utime, stime


def find_processes(*needles: str) -> dict[str, list[int]]:
    """Pids whose command line contains each needle (Ray titles its workers ``ray::<Actor>...``)."""
    found: dict[str, list[int]] = {n: [] for n in needles}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        for n in needles:
            if n in cmd:
                found[n].append(int(entry.name))
    return found


def cpu_snapshot(groups: dict[str, list[int]]) -> dict[tuple[str, int], tuple[float, float]]:
    """(user, system) CPU seconds so far of each (group, pid), and of this process (``client``)."""
    out = {}
    for name, pids in groups.items():
        for pid in pids:
            try:
                out[(name, pid)] = _cpu_seconds(pid)
            except OSError:  # gone (HAProxy replaces its process on each reload)
                continue
    times = os.times()
    out[("client", os.getpid())] = (times.user, times.system)
    return out


def cpu_spent(before: dict, after: dict) -> dict[str, list[float]]:
    """CPU seconds [user, system] per group between two snapshots, over the pids alive in both."""
    spent: dict[str, list[float]] = {}
    for key in before.keys() & after.keys():
        total = spent.setdefault(key[0], [0.0, 0.0])
        for i in (0, 1):
            total[i] += after[key][i] - before[key][i]
    return spent


# --- part 1: in process ------------------------------------------------------------------------------
def bench_in_process(n: int) -> dict:
    """Microseconds per /route answer: the routing function, then the whole ASGI app without a network."""
    served = load_served_tree(SEED)
    metrics = [b["metrics"] for b in BODIES]
    t0 = time.perf_counter()
    for i in range(n):
        next_step(served, metrics[i % len(metrics)]).as_dict()
    routing_us = (time.perf_counter() - t0) / n * 1e6

    app = make_api(ServiceCore(settings_from_args({"workers": 0})))
    payloads = [json.dumps(b).encode() for b in BODIES]

    async def call(body: bytes) -> int:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/route",
            "raw_path": b"/route",
            "root_path": "",
            "query_string": b"",
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
        }
        sent = [{"type": "http.request", "body": body, "more_body": False}]
        status = []

        async def receive():
            return sent.pop() if sent else {"type": "http.disconnect"}

        async def send(message):
            if message["type"] == "http.response.start":
                status.append(message["status"])

        await app(scope, receive, send)
        return status[0]

    async def run(count: int) -> float:
        for body in payloads:  # build the middleware stack, warm caches
            assert await call(body) == 200
        t = time.perf_counter()
        for i in range(count):
            await call(payloads[i % len(payloads)])
        return (time.perf_counter() - t) / count * 1e6

    asgi_us = asyncio.run(run(max(1, n // 10)))
    return {"routing_us": round(routing_us, 1), "asgi_us": round(asgi_us, 1), "calls": n}


# --- part 2: HTTP load ---------------------------------------------------------------------------------
async def load(url: str, clients: int, seconds: float, warmup: float) -> dict:
    """``clients`` concurrent loops posting /route bodies for ``seconds`` (after ``warmup``)."""
    import aiohttp

    payloads = [json.dumps(b).encode() for b in BODIES]
    headers = {"content-type": "application/json"}
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        measuring = False
        stop = time.monotonic() + warmup + seconds

        async def client(k: int) -> None:
            i = k
            while time.monotonic() < stop:
                t = time.perf_counter()
                async with session.post(url, data=payloads[i % len(payloads)], headers=headers) as r:
                    await r.read()
                    status = r.status
                if measuring:
                    latencies.append(time.perf_counter() - t)
                    statuses[status] = statuses.get(status, 0) + 1
                i += 1

        tasks = [asyncio.create_task(client(k)) for k in range(clients)]
        await asyncio.sleep(warmup)
        measuring, started = True, time.monotonic()
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - started
    ms = [x * 1000 for x in latencies]
    return {
        "clients": clients,
        "requests": len(ms),
        "rps": round(len(ms) / elapsed, 1),
        "p50_ms": round(percentile(ms, 50), 2),
        "p90_ms": round(percentile(ms, 90), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "max_ms": round(max(ms), 2),
        "non_200": {str(k): v for k, v in statuses.items() if k != 200},
    }


CPU_GROUPS = {
    "proxy": "ProxyActor",
    "haproxy": "haproxy -db",
    "replica": "ServeReplica:route",
    "uvicorn": "uvicorn-bench",
}


def bench_http(port: int, clients_list: list[int], seconds: float) -> list[dict]:
    """One row per load level against ``127.0.0.1:port/route``, with CPU per request per process group."""
    url = f"http://127.0.0.1:{port}/route"
    rows = []
    for clients in clients_list:
        before_load = load_average()
        procs = find_processes(*CPU_GROUPS.values())
        cpu0 = cpu_snapshot(procs)
        row = asyncio.run(load(url, clients, seconds, warmup=1.0))
        spent = cpu_spent(cpu0, cpu_snapshot(procs))
        n = max(1, row["requests"])
        names = {**{label: key for label, key in CPU_GROUPS.items() if key in spent}, "client": "client"}
        row["cpu_ms_per_request"] = {  # [user, system]
            label: [round(spent[key][i] / n * 1000, 3) for i in (0, 1)] for label, key in names.items()
        }
        row["load_before"], row["load_after"] = before_load, load_average()
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# --- part 3: /optimize ----------------------------------------------------------------------------------
def bench_optimize(port: int, jobs: int) -> dict:
    import httpx

    from autoprofiler.tasks import load_task_file

    base = f"http://127.0.0.1:{port}/opt"
    tasks = [load_task_file(ROOT / "datasets" / "suite" / "l1" / f"{name}.py") for name in OPTIMIZE_TASKS]
    tasks = (tasks * (jobs // len(tasks) + 1))[:jobs]
    load_before = load_average()
    with httpx.Client(base_url=base, timeout=60) as client:
        t0 = time.time()
        ids = []
        for task in tasks:
            r = client.post("/optimize", json={"task_source": task.source, "task_id": task.id})
            r.raise_for_status()
            ids.append(r.json()["id"])
        states: dict[str, dict] = {}
        while len(states) < len(ids):
            for job_id in ids:
                if job_id not in states:
                    state = client.get(f"/optimize/{job_id}").json()
                    if state["status"] in ("done", "failed"):
                        states[job_id] = state
            time.sleep(0.5)
        wall = time.time() - t0
    per_job = []
    for job_id in ids:
        s = states[job_id]
        res = s["result"] or {}
        per_job.append(
            {
                "task": s["task_id"],
                "status": s["status"],
                "wait_s": round(s["started_at"] - s["submitted_at"], 2) if s["started_at"] else None,
                "run_s": round(s["finished_at"] - s["started_at"], 2) if s["started_at"] else None,
                "leaf": res.get("leaf"),
                "profile_s": res.get("profile_s"),
                "eval_s": res.get("eval_s"),
                "correct": res.get("correct"),
                "speedup": res.get("speedup"),
                "error": s["error"] or res.get("error") or "",
            }
        )
    runs = [j["run_s"] for j in per_job if j["run_s"] is not None]
    return {
        "jobs": len(ids),
        "wall_s": round(wall, 1),
        "jobs_per_min": round(len(ids) / wall * 60, 2),
        "run_s_median": round(statistics.median(runs), 2) if runs else None,
        "first_run_s": per_job[0]["run_s"],
        "load_before": load_before,
        "load_after": load_average(),
        "per_job": per_job,
    }


# --- the parts, each in its own process -------------------------------------------------------------
INGRESS_ENV = {
    "proxy": {},
    "haproxy": {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},
}


def _service_options() -> tuple[dict, dict]:
    """(the app's args, the Service deployment's options) from serve_config.yaml."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    (application,) = config["applications"]
    service = next(d for d in application["deployments"] if d["name"] == "Service")
    return application["args"], {k: v for k, v in service.items() if k != "name"}


def part_uvicorn(clients: list[int], seconds: float) -> list[dict]:
    """The route-only ASGI app in one plain uvicorn process (titled ``uvicorn-bench``)."""
    import subprocess

    port = free_port()
    code = (
        "import sys, uvicorn\n"
        "from autoprofiler.serving import settings_from_args\n"
        "from autoprofiler.serving.api import ServiceCore, make_api\n"
        "app = make_api(ServiceCore(settings_from_args({'workers': 0})))\n"
        f"uvicorn.run(app, host='127.0.0.1', port={port}, log_level='warning', access_log=False)\n"
    )
    server = subprocess.Popen([sys.executable, "-c", code, "uvicorn-bench"], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        return bench_http(port, clients, seconds)
    finally:
        server.terminate()
        server.wait(30)


def part_serve(clients: list[int], seconds: float, jobs: int) -> dict:
    """The route-only app under load, then (``jobs`` > 0) the optimize app; this process's Serve flags."""
    import ray
    from ray import serve

    from autoprofiler.serving.app import build_app

    args, service_options = _service_options()
    out: dict = {}
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(build_app(settings_from_args({"workers": 0}), service_options), name="route")
        out["http"] = bench_http(port, clients, seconds)
        if jobs:
            serve.delete("route")
            opt = settings_from_args({**args, "profile_cache": None})
            serve.run(build_app(opt, service_options), name="opt", route_prefix="/opt")
            out["optimize"] = bench_optimize(port, jobs)
    finally:
        serve.shutdown()
        ray.shutdown()
    return out


def run_child(part: str, ingress: str, args: argparse.Namespace) -> dict:
    """Run one part in a fresh interpreter with the ingress's Ray Serve flags; its JSON result."""
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
        command = [sys.executable, __file__, "--part", part, "--clients", args.clients, "--seconds",
                   str(args.seconds), "--jobs", str(args.jobs if ingress == "proxy" else 0), "--child-out",
                   tmp.name]  # fmt: skip
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **INGRESS_ENV.get(ingress, {})}
        print(f"--- {part} {ingress}", flush=True)
        subprocess.run(command, env=env, check=True, cwd=ROOT)
        return json.loads(Path(tmp.name).read_text())


# --- report ------------------------------------------------------------------------------------------
def where_the_time_goes(result: dict) -> str:
    """Notes computed from the measured numbers (so they stay true when the bench is rerun)."""
    ip = result["in_process"]
    lines = [
        f"- The service's own work is small: routing (`next_step`) {ip['routing_us']} us, the whole ASGI "
        f"app (auth, FastAPI, pydantic, JSON) {ip['asgi_us']} us per answer, in process.",
    ]
    for ingress, rows in result["http"].items():
        best = max(rows, key=lambda r: r["rps"])
        cpu = {k: round(u + s, 2) for k, (u, s) in best["cpu_ms_per_request"].items()}
        server = round(sum(v for k, v in cpu.items() if k != "client"), 2)
        ceiling = 2000 / (server + cpu.get("client", 0.0))
        little = "; ".join(
            f"{r['clients']} clients / {r['rps']} req/s = {r['clients'] / r['rps'] * 1000:.1f} ms, "
            f"p50 {r['p50_ms']} ms"
            for r in rows
            if r["clients"] > 1
        )
        lines.append(
            f"- {ingress}: p50 {rows[0]['p50_ms']} ms for one client. At its best load ({best['clients']} "
            f"clients, {best['rps']} req/s) a request costs {server} ms of server CPU "
            f"({', '.join(f'{k} {v}' for k, v in cpu.items())} ms), so the 2 CPUs, shared with the load "
            f"generator, allow about {ceiling:.0f} req/s. Closed-loop clients then wait in line for the "
            f"CPUs (Little's law: {little or 'n/a'})."
        )
    aim = [
        f"{ingress} {r['p99_ms']} ms ({'met' if r['p99_ms'] < 10 else 'not met'})"
        for ingress, rows in result["http"].items()
        for r in rows
        if r["clients"] == 10
    ]
    lines.append(f"- Aim, /route p99 under 10 ms at 10 clients: {'; '.join(aim) or 'not measured'}.")
    return "\n".join(lines)


def write_report(out: Path, result: dict) -> None:
    ip, opt = result["in_process"], result.get("optimize")
    lines = [
        "# Serve latency: /route and /optimize on loopback",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {result['machine']}; {result['date']}  ",
        f"Service: {result['service']}",
        "",
        "## /route in this process (no network)",
        "",
        "| what | us per answer |",
        "| --- | --- |",
        f"| `routing.next_step` + `as_dict` | {ip['routing_us']} |",
        f"| whole ASGI app (auth, FastAPI, pydantic, JSON), called directly | {ip['asgi_us']} |",
        "",
        "## /route over HTTP, bounded concurrent load (closed loop: each client waits for its answer)",
        "",
        "CPU ms per request as user+system. The load average (1 minute) counts this benchmark's own "
        "processes too (about 2 while a level runs); readings above that mean other work shared the CPUs.",
        "",
        "| ingress | clients | requests | req/s | p50 ms | p90 ms | p99 ms | max ms | non-200 | "
        "CPU ms/req by process | load avg before -> after |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for ingress, rows in result["http"].items():
        for r in rows:
            cpu = ", ".join(f"{k} {u}+{s}" for k, (u, s) in r["cpu_ms_per_request"].items())
            lines.append(
                f"| {ingress} | {r['clients']} | {r['requests']} | {r['rps']} | {r['p50_ms']} | "
                f"{r['p90_ms']} | {r['p99_ms']} | {r['max_ms']} | {r['non_200'] or 0} | {cpu} | "
                f"{r['load_before']} -> {r['load_after']} |"
            )
    if opt:
        lines += [
            "",
            "## /optimize on CPU (Serve proxy ingress, one worker, jobs submitted at once)",
            "",
            f"{opt['jobs']} jobs in {opt['wall_s']} s = {opt['jobs_per_min']} jobs/min; median run "
            f"{opt['run_s_median']} s per job (the first, {opt['first_run_s']} s, includes the worker's "
            f"start); load avg {opt['load_before']} -> {opt['load_after']}",
            "",
            "| task | status | wait s | run s | leaf | profile s | eval s | correct | speedup | error |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for j in opt["per_job"]:
            speed = f"{j['speedup']:.3f}" if j["speedup"] else ""
            lines.append(
                f"| {j['task']} | {j['status']} | {j['wait_s']} | {j['run_s']} | {j['leaf']} | "
                f"{j['profile_s']} | {j['eval_s']} | {j['correct']} | {speed} | {str(j['error'])[:80]} |"
            )
    lines += ["", "## Where the time goes", "", where_the_time_goes(result), ""]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", default="1,10,100", help="concurrent clients, comma-separated")
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per load level")
    p.add_argument("--calls", type=int, default=20000, help="in-process routing calls")
    p.add_argument("--jobs", type=int, default=7, help="/optimize jobs (0: skip)")
    p.add_argument("--ingress", default="uvicorn,proxy,haproxy", help="ingresses to measure")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "serve_latency.md"))
    p.add_argument("--part", choices=("uvicorn", "serve"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    clients = [int(c) for c in args.clients.split(",")]
    if args.part is not None:  # a child: one part, its JSON to --child-out
        if args.part == "uvicorn":
            answer: dict = {"http": part_uvicorn(clients, args.seconds)}
        else:
            answer = part_serve(clients, args.seconds, args.jobs)
        Path(args.child_out).write_text(json.dumps(answer))
        return 0

    _, service_options = _service_options()
    result: dict = {
        "command": "python bench/serve_latency.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "service": f"route-only Service with {service_options}, tree trees/seed_torch.json",
        "http": {},
    }
    print("in-process ...", flush=True)
    result["in_process"] = bench_in_process(args.calls)
    print(json.dumps(result["in_process"]), flush=True)
    for ingress in args.ingress.split(","):
        part = run_child("uvicorn" if ingress == "uvicorn" else "serve", ingress, args)
        result["http"][ingress] = part["http"]
        if "optimize" in part:
            result["optimize"] = part["optimize"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    write_report(out, result)
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
