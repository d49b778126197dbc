"""``ray job submit`` against a head started here: the oracle sweep as a Ray job on one tiny suite task.

The fixture starts a head with ``ray start --head`` on 127.0.0.1 (free ports, its own ``--temp-dir``,
2 CPUs, the dashboard on, in a process session of its own) and stops it by killing that session's
processes by id: ``ray stop`` would stop every Ray process on the machine, other tests' included. The
job uploads this checkout (``--working-dir .``, with ``.git`` so rows carry the git state, see
docs/cluster.md), joins the head from its driver and runs one ``GpuWorker`` actor (no GPU here).
44-64 s on a 2-CPU machine (head start 10-12 s, the job 32-42 s, stop 3-9 s; two runs).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[1]
RAY = Path(sys.executable).with_name("ray")  # the CLI of the Ray this interpreter imports
TINY_EVAL = ["eval.timing_trials=3", "eval.warmup=1", "eval.correctness_trials=1"]
pytestmark = pytest.mark.skipif(
    not RAY.exists() or not Path("/proc").is_dir(), reason="needs the ray CLI beside python, and /proc"
)


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now (held together while asking, so never equal)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def ray_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", **extra}
    env.pop("RAY_ADDRESS", None)
    return env


def session_pids(sid: int) -> list[int]:
    """Processes of the session ``sid`` (every process the head started, whoever their parent is now)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    pids.append(int(entry))
            except OSError:  # gone meanwhile
                pass
    return pids


def stop_session(sid: int, grace_s: float = 1.0) -> None:
    """SIGTERM, then SIGKILL what is left after ``grace_s``: the head's processes only, by id."""
    assert sid != os.getsid(0), "refusing to stop the test runner's own session"
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in session_pids(sid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not session_pids(sid):
            return


@dataclass
class Head:
    address: str  # the dashboard (job and state APIs)
    temp: Path  # the head's --temp-dir: sessions, logs, uploaded working dirs
    sid: int


@pytest.fixture(scope="module")
def head():
    """A Ray head on 127.0.0.1 with the dashboard, 2 CPUs and no GPU; stopped (its session killed) after."""
    temp = Path(tempfile.mkdtemp(prefix="rj", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    gcs, dashboard, client, agent = free_ports(4)
    command = [
        str(RAY), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}", "--num-cpus=2",
        "--num-gpus=0", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard}", f"--ray-client-server-port={client}",
        f"--dashboard-agent-listen-port={agent}", "--disable-usage-stats", f"--temp-dir={temp}",
    ]  # fmt: skip
    start = subprocess.Popen(
        command,
        env=ray_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # every process of the head inherits this session id
    )
    try:
        output, _ = start.communicate(timeout=180)
        if start.returncode != 0:
            pytest.fail(f"ray start failed ({start.returncode}):\n{output[-3000:]}")
        yield Head(f"http://127.0.0.1:{dashboard}", temp, start.pid)
    finally:
        if start.poll() is None:
            start.kill()
        stop_session(start.pid)
        shutil.rmtree(temp, ignore_errors=True)


def test_the_oracle_sweep_runs_as_a_job_on_the_head(head):
    """``ray job submit --working-dir . -- python workflows/oracle_sweep.py ...`` succeeds; its rows and
    config (with the submitter's git state) are written; the driver joined this head, whose CellWorker
    actor produced the rows."""
    out = head.temp / "rec"
    submit = [
        str(RAY), "job", "submit", "--address", head.address, "--submission-id", "autoprofiler-ci-sweep",
        "--working-dir", ".", "--",
        sys.executable, "workflows/oracle_sweep.py", f"out_dir={out}", "filter=[relu]",
        "groups=[torch_root]", "actions=[keep]", "configurations=[]", *TINY_EVAL,
    ]  # fmt: skip
    # Ray leaves .git out of a working dir by default; upload it so rows carry the git state (docs/cluster.md)
    env = ray_env(RAY_OVERRIDE_RUNTIME_ENV_DEFAULT_EXCLUDES=".venv,venv,__pycache__")
    proc = subprocess.run(submit, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Job 'autoprofiler-ci-sweep' succeeded" in log, log[-4000:]
    assert "Traceback" not in log, log[-4000:]

    # the driver joined this head and ran from the working dir uploaded to it
    assert "Connecting to existing Ray cluster" in log, log[-4000:]
    assert re.search(rf"tasks: 1 from {re.escape(str(head.temp))}/session_", log), log[-4000:]

    # its outputs: one action row with provenance, the profile, the resolved config
    from autoprofiler.tables import read_table

    rows = read_table(out / "rewards", "reward").to_pylist()
    assert [(r["kind"], r["action"], r["device"]) for r in rows] == [("action", "keep", "cpu")]
    # correct, or flagged only for its speed: 3 timed calls of an identity candidate on a loaded 2-CPU
    # machine can measure anything (21.5x was seen), and this test is about the job, not the timing
    noise = rows[0]["error_kind"] == "suspicious" and "is above suspicious_speedup" in rows[0]["error"]
    assert rows[0]["run_id"] and (rows[0]["correct"] or noise), (rows[0]["error_kind"], rows[0]["error"])
    assert [p["group"] for p in read_table(out / "profiles", "profile").to_pylist()] == ["torch_root"]
    config = json.loads((out / "config.json").read_text())
    assert config["runtime"]["ray"] is True and config["filter"] == ["relu"]
    sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if sha.returncode == 0:  # a git checkout: its state travelled with the upload
        assert config["provenance"]["git_sha"] == rows[0]["git_sha"] == sha.stdout.strip()

    # the row's worker is the CellWorker actor this head scheduled
    from ray.util.state import list_actors

    actors = list_actors(
        address=head.address,
        filters=[("class_name", "=", "CellWorker")],
        detail=True,
        raise_on_missing_output=False,
    )
    pid = int(re.fullmatch(r".*:(\d+)", rows[0]["worker"]).group(1))
    assert pid in {a.pid for a in actors}, (rows[0]["worker"], actors)
