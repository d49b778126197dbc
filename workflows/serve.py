"""python workflows/serve.py [--config serve_config.yaml] [key=value ...]

Start the autoprofiler service locally (Ray, Serve's HTTP proxy, the app of ``serve_config.yaml``) and
keep it up until Ctrl-C; the same config ``serve run serve_config.yaml`` takes. Examples:

    python workflows/serve.py                                           # http://127.0.0.1:8000
    python workflows/serve.py tree=runs/train-cpu/tree.json workers=0 port=8001   # route-only
    AUTOPROFILER_SERVE_TOKEN=$(openssl rand -hex 16) python workflows/serve.py host=0.0.0.0

Overrides (YAML values): ``host``, ``port`` (``http_options``); ``max_ongoing_requests``,
``max_queued_requests``, ``num_replicas`` (the ``Service`` deployment); ``ingress=haproxy`` (Serve's
HAProxy ingress instead of its Python proxy: several times less CPU per request, see
``bench/results/serve_latency.md``; only when this script starts Ray); any application arg
(``autoprofiler.serving.settings.ServeSettings``: ``tree``, ``workers``, ``device``, ``eval``, ...).
Every problem is reported at once (exit 2); a non-loopback host without a token is refused (exit 2);
workers on a CUDA device this machine (or the cluster) does not have, or Ray or Serve failing to start,
exit 3 with one line, before any replica starts.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # a bare checkout runs it too
    sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

from autoprofiler.serving.settings import SettingsError, check_binding, settings_from_args  # noqa: E402

EXIT_BAD_INPUT, EXIT_ENVIRONMENT = 2, 3
HTTP_KEYS = {"host": str, "port": int, "ingress": str}
#: Ray Serve flags per ingress; read by every Ray process at start, so set before Ray starts.
INGRESS_ENV = {
    "proxy": {},
    "haproxy": {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},
}
SERVICE_KEYS = {"max_ongoing_requests": int, "max_queued_requests": int, "num_replicas": int}


def read_config(argv: list[str]) -> tuple[dict, dict, dict, dict]:
    """(http_options, app entry, Service options, Optimizer options) from the file and the overrides.

    Raises ``SettingsError`` with every problem.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "serve_config.yaml"), help="a Serve config file")
    parser.add_argument("overrides", nargs="*", help="key=value (YAML values)")
    args = parser.parse_intermixed_args(argv)
    try:
        config = yaml.safe_load(Path(args.config).read_text())
        (app,) = config["applications"]
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError) as exc:
        raise SettingsError([f"--config {args.config}: not a one-application Serve config ({exc})"]) from None
    http = dict(config.get("http_options") or {})
    deployments = {d["name"]: {k: v for k, v in d.items() if k != "name"} for d in app.get("deployments", [])}
    service, optimizer = deployments.get("Service", {}), deployments.get("Optimizer", {})
    app_args = dict(app.get("args") or {})
    problems = []
    for item in args.overrides:
        key, eq, raw = item.partition("=")
        if not eq:
            problems.append(f"override {item!r}: expected key=value")
            continue
        try:
            value = yaml.safe_load(raw) if raw else None
        except yaml.YAMLError:
            problems.append(f"override {key!r}: {raw!r} is not a YAML value")
            continue
        for target, types in ((http, HTTP_KEYS), (service, SERVICE_KEYS)):
            if key in types:
                if not isinstance(value, types[key]) or isinstance(value, bool):
                    problems.append(f"{key}: expected {types[key].__name__}, got {value!r}")
                target[key] = value
                break
        else:
            app_args[key] = value
    try:
        settings = settings_from_args(app_args)
    except SettingsError as exc:
        problems += exc.problems
        settings = None
    ingress = http.get("ingress", "proxy")
    if ingress not in INGRESS_ENV:
        problems.append(f"ingress: expected one of {sorted(INGRESS_ENV)}, got {ingress!r}")
    elif ingress != "proxy" and os.environ.get("RAY_ADDRESS"):
        problems.append(f"ingress={ingress}: start the cluster with {INGRESS_ENV[ingress]} instead")
    if problems:
        raise SettingsError(problems)
    return http, {**app, "settings": settings}, service, optimizer


def main(argv: list[str]) -> int:
    try:
        http, app, service_options, optimizer_options = read_config(argv)
        settings = app["settings"]
        host, port = http.get("host", "127.0.0.1"), int(http.get("port", 8000))
        os.environ.update(INGRESS_ENV[http.get("ingress", "proxy")])
        check_binding(host, settings.token)
    except SettingsError as exc:
        print("error: " + "; ".join(exc.problems), file=sys.stderr)
        return EXIT_BAD_INPUT
    from autoprofiler.workflow import environment_problem

    runtime = {"ray": True}
    problem = environment_problem(settings.device, "torch", runtime) if settings.workers else None
    if problem:  # before Ray starts: a replica that cannot start would be retried, tracebacks and all
        print(f"error: {problem} (or workers=0 for a route-only service)", file=sys.stderr)
        return EXIT_ENVIRONMENT
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from ray import serve

    from autoprofiler.runtime.ray_driver import cluster_gpus, init_ray
    from autoprofiler.serving.app import build_app

    try:
        init_ray(quiet=False)
        wanted = settings.workers if settings.device.startswith("cuda") else 0
        if wanted > cluster_gpus():
            print(
                f"error: workers={settings.workers} on {settings.device} need {wanted} GPUs; the Ray cluster "
                f"has {cluster_gpus()}; add GPU workers (docs/cluster.md), set device=cpu, or workers=0",
                file=sys.stderr,
            )
            return EXIT_ENVIRONMENT
        serve.start(http_options={"host": host, "port": port})
        serve.run(
            build_app(settings, service_options, optimizer_options),
            name=app.get("name", "autoprofiler"),
            route_prefix=app.get("route_prefix", "/"),
        )
    except Exception as exc:  # port taken, cluster unreachable, a replica that fails to start
        print(f"error: the service did not start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ENVIRONMENT
    prefix = app.get("route_prefix", "/").rstrip("/")
    url = f"http://{host}:{port}{prefix}"
    auth = ' -H "Authorization: Bearer $AUTOPROFILER_SERVE_TOKEN"' if settings.token else ""
    print(f"serving on {url} (Ctrl-C stops); try: curl{auth} {url}/tree", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("shutting down", flush=True)
    finally:
        serve.shutdown()
    return 0


def _interrupt(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
