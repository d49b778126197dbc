"""Sandboxed worker processes: the fork server ("zygote"), one worker, a pair, the worker environment.

A worker runs ``_harness.py`` (by path: no package ``__init__`` runs inside the sandbox) in one role
(reference or candidate) in its own session, temp dir and scrubbed environment; the job goes in on a
pipe and lines come back on another. A ``Pair`` is the two workers of one evaluation, joined by a
socket of their own. ``ForkServer`` imports torch once and forks fresh workers from it (milliseconds
instead of seconds); ``Worker`` without a server starts a new interpreter with ``Popen``. The
``Evaluator`` (``evaluator.py``) owns them; nothing here knows about tasks or results.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from autoprofiler.evaluation import _harness
from autoprofiler.evaluation.results import EvalConfig, EvaluatorError

log = logging.getLogger(__name__)

HARNESS_PATH = Path(_harness.__file__).resolve()
PACKAGE_ROOT = HARNESS_PATH.parents[2]  # the folder holding the autoprofiler package
# As root, the candidate process becomes this user (AUTOPROFILER_EVAL_DROP_PRIVILEGES=0 keeps root).
UNPRIVILEGED_ID = _harness.UNPRIVILEGED_ID
DROP_PRIVILEGES = os.environ.get("AUTOPROFILER_EVAL_DROP_PRIVILEGES", "1") != "0"
# On CUDA a worker loads cuBLAS and cuDNN and makes their handles while it waits as a spare, so an
# evaluation's first matmul or convolution does not pay it (AUTOPROFILER_EVAL_WARM_LIBRARIES=0: it does).
WARM_LIBRARIES = os.environ.get("AUTOPROFILER_EVAL_WARM_LIBRARIES", "1") != "0"
# Environment variables passed through to the worker unchanged when set (everything else is dropped).
PASSTHROUGH_ENV = (
    "LANG",
    "LC_ALL",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "CUDA_HOME",
    "CUDA_PATH",
    "CUDA_ROOT",
    "LD_LIBRARY_PATH",
    "CC",
    "CXX",
    "TORCH_CUDA_ARCH_LIST",
    "MAX_JOBS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "AUTOPROFILER_EVAL_SHARE_INPUTS",
)
# ... and every variable with one of these prefixes: CUDA/NCCL/driver configuration, not secrets (e.g. the
# H200 image's NCCL_NVLS_ENABLE=0 must reach every process).
PASSTHROUGH_PREFIXES = ("CUDA_", "NCCL_", "NVSHMEM_", "NVIDIA_", "TORCH_CUDA_", "TORCH_SYMM_MEM_", "PYTORCH_")


_LOGS = ("stderr.log", "stdout.log")  # a worker's output files, in the order its log tail shows them


def file_tail(path: Path, limit: int) -> str:
    """The last ``limit`` bytes of ``path``, decoded (bad bytes replaced); ``""`` where it cannot be read."""
    try:
        return path.read_bytes()[-limit:].decode("utf-8", "replace")
    except OSError:
        return ""


class ForkServer:
    """A zygote process that imported torch once and forks a fresh worker per request (``_harness``).

    Forking a clean zygote costs milliseconds where starting Python and importing torch costs seconds:
    each worker is still a fresh process (the candidate only ever touches its own fork), with its own
    session, temp dir, environment and file descriptors. The zygote reaps its children and reports their
    exit codes, which is how a crash's signal reaches the parent.
    """

    def __init__(self, config: EvalConfig):
        self.tmp = Path(tempfile.mkdtemp(prefix="autoprofiler-zygote-"))
        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        logfile = open(self.tmp / "zygote.log", "wb")  # noqa: SIM115 - handed to the child
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-s", str(HARNESS_PATH), "--zygote-fd", str(child_sock.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=logfile,
                pass_fds=(child_sock.fileno(),),
                start_new_session=True,
                env=worker_env(config, self.tmp),
                cwd=self.tmp,
            )
        finally:
            child_sock.close()
            logfile.close()
        self.sock = parent_sock
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self.ready = False
        self.dead = False
        self.error = ""
        self._spawned: dict[str, int] = {}
        self._exits: dict[int, int] = {}
        self._thread = threading.Thread(target=self._read_loop, name="autoprofiler-zygote", daemon=True)
        self._thread.start()
        log.debug("started evaluation fork server pid=%d", self.proc.pid)

    def _read_loop(self) -> None:
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                with self._cond:
                    self.dead = True
                    self._cond.notify_all()
                return
            try:
                msg = json.loads(data)
            except ValueError:
                continue
            with self._cond:
                if msg.get("zygote_ready"):
                    self.ready = True
                elif "zygote_error" in msg:
                    self.error = str(msg["zygote_error"])
                elif "spawned" in msg:
                    self._spawned[msg["id"]] = int(msg["spawned"])
                elif "exited" in msg:
                    self._exits[int(msg["exited"])] = int(msg["code"])
                self._cond.notify_all()

    def request(self, tmp: Path, env: dict, args: list[str], fds: list[int]) -> str:
        """Queue a fork (``fds``: job read end, result write end, link end); returns the request id (the
        pid follows via ``pid``). Does not block."""
        rid = secrets.token_hex(8)
        payload = json.dumps({"id": rid, "tmp": str(tmp), "env": env, "args": args}).encode()
        with self._send_lock:
            try:
                socket.send_fds(self.sock, [payload], fds)
            except OSError as exc:
                with self._cond:
                    self.dead = True
                raise EvaluatorError(f"the evaluation fork server is gone: {exc}") from exc
        return rid

    def pid(self, rid: str, timeout: float) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: rid in self._spawned or self.dead, timeout)
            return self._spawned.get(rid)

    def exit_code(self, pid: int, timeout: float) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or self.dead, timeout)
            return self._exits.get(pid)

    def forget(self, rid: str, pid: int | None) -> None:
        with self._cond:
            self._spawned.pop(rid, None)
            if pid is not None:
                self._exits.pop(pid, None)

    def log_tail(self, limit: int = 800) -> str:
        return file_tail(self.tmp / "zygote.log", limit).strip()

    def close(self) -> None:
        try:  # shutdown (not only close) wakes the reader thread and gives the zygote EOF: it exits
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self.proc.wait(timeout=10)
        shutil.rmtree(self.tmp, ignore_errors=True)


class Worker:
    """One sandboxed worker process in one role, from spawn to disposal (forked by a ``ForkServer`` or
    Popen'd). ``link_fd`` is its end of the pair's link; the worker keeps its own copy."""

    def __init__(self, config: EvalConfig, role: str, link_fd: int, server: ForkServer | None = None):
        self.config = config
        self.role = role
        self.server = server
        self.tmp = Path(tempfile.mkdtemp(prefix=f"autoprofiler-{role[:3]}-"))
        self.ready = False
        self.info: dict = {}
        self.phase = "starting"
        self._buf = b""
        self._pid: int | None = None
        self._rid: str | None = None
        self.proc: subprocess.Popen | None = None
        drop = role == "candidate" and os.geteuid() == 0 and DROP_PRIVILEGES
        if drop:  # the unprivileged candidate writes its temp dir (logs are opened before the drop)
            os.chown(self.tmp, UNPRIVILEGED_ID, UNPRIVILEGED_ID)
        result_r, result_w = os.pipe()
        job_r, job_w = os.pipe()
        self.read_fd, self.job_fd = result_r, job_w
        args = [
            "--role",
            role,
            "--device",
            config.device,
            "--memory-limit-gb",
            str(config.memory_limit_gb or 0),
        ]
        if drop:
            args.append("--drop-privileges")
        if WARM_LIBRARIES and config.device.startswith("cuda"):
            args.append("--warm-libraries")
        env = worker_env(config, self.tmp, role)
        try:
            if server is not None:
                self._rid = server.request(self.tmp, env, args, [job_r, result_w, link_fd])
            else:
                with open(self.tmp / "stdout.log", "wb") as out, open(self.tmp / "stderr.log", "wb") as err:
                    self.proc = subprocess.Popen(
                        [
                            sys.executable,
                            "-s",
                            str(HARNESS_PATH),
                            "--result-fd",
                            str(result_w),
                            "--link-fd",
                            str(link_fd),
                            *args,
                        ],
                        stdin=job_r,
                        stdout=out,
                        stderr=err,
                        pass_fds=(result_w, link_fd),
                        start_new_session=True,
                        env=env,
                        cwd=self.tmp,
                    )
                self._pid = self.proc.pid
        except BaseException:
            for fd in (result_r, job_w):
                os.close(fd)
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        finally:
            os.close(result_w)
            os.close(job_r)

    @property
    def pid(self) -> int | None:
        if self._pid is None and self.server is not None and self._rid is not None:
            self._pid = self.server.pid(self._rid, 30.0)
        return self._pid

    def _read_line(self, deadline: float) -> bytes | None:
        """The next line from the result pipe; ``None`` at EOF; ``TimeoutError`` at the deadline."""
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self.read_fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def read_available(self) -> tuple[list[bytes], bool]:
        """Complete lines readable now without blocking, and whether the pipe reached EOF."""
        chunk = os.read(self.read_fd, 1 << 16)
        if not chunk:
            return [], True
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        return lines, False

    def wait_ready(self, timeout_s: float) -> str | None:
        """Block until the worker is warm. Returns ``None`` when ready, else why it is not."""
        if self.ready:
            return None
        deadline = time.monotonic() + timeout_s
        try:
            line = self._read_line(deadline)
        except TimeoutError:
            return f"the {self.role} worker did not become ready within {timeout_s:.0f} s"
        if line is None:
            extra = f" fork server: {self.server.error or self.server.log_tail()}" if self.server else ""
            reason = self.exit_reason()
            return f"the {self.role} worker exited during start-up ({reason}): {self.log_tail()}{extra}"
        try:
            msg = json.loads(line)
        except ValueError:
            return f"unexpected start-up line {line[:200]!r}"
        if msg.get("ready"):
            self.ready = True
            self.info = msg
            return None
        return f"the {self.role} worker failed to start: {msg.get('startup_error', msg)}"

    def send_job(self, job: dict) -> None:
        try:
            with os.fdopen(self.job_fd, "wb") as fh:
                self.job_fd = -1
                fh.write(json.dumps(job).encode())
        except OSError:
            pass  # it died; reading reports how

    def exit_code(self, timeout: float) -> int | None:
        if self.proc is not None:
            try:
                return self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                return None
        pid = self.pid
        return None if pid is None or self.server is None else self.server.exit_code(pid, timeout)

    def exit_reason(self, timeout: float = 5.0) -> str:
        code = self.exit_code(timeout)
        if code is None:
            return "exit status unknown"
        if code < 0:
            try:
                return f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exit code {code}"

    def log_mentions(self, texts: tuple[str, ...], limit: int = 1 << 16) -> bool:
        """Whether the last ``limit`` bytes of the process's stderr or stdout hold one of ``texts``. An
        error's head can lie far before the tail ``log_tail`` shows: CUDA's out-of-memory message lists
        every process on the device after its first line, often more than 1,500 characters."""
        return any(t in file_tail(self.tmp / name, limit) for name in _LOGS for t in texts)

    def log_tail(self, limit: int = 1500) -> str:
        parts = []
        for name in _LOGS:
            if text := file_tail(self.tmp / name, limit).strip():
                parts.append(f"[{name}] {text}")
        text = "output tail: " + (" ".join(parts) or "(no output)")
        return text[-limit:]

    def kill(self) -> None:
        """Kill the whole process group (the candidate may have left children behind)."""
        pid = self.pid
        if pid is not None:
            for kill in (os.killpg, os.kill):
                try:
                    kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def dispose(self) -> None:
        """Kill the process group, close the pipes, remove the temp dir."""
        self.kill()
        pid = self.pid
        if pid is not None:
            self.exit_code(10.0)
        if self.server is not None and self._rid is not None:
            self.server.forget(self._rid, pid)
        for fd in (self.read_fd, self.job_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.read_fd = self.job_fd = -1
        shutil.rmtree(self.tmp, ignore_errors=True)


class Pair:
    """The two processes of one evaluation: a reference worker and a candidate worker, joined by a link.

    The link (a ``SOCK_SEQPACKET`` socketpair) is made here and handed to both at spawn; the parent
    keeps no end of it. The parent sends each its job, then waits for the reference worker's result
    line, reading the candidate worker's result pipe meanwhile: after its readiness line the candidate
    has nothing to say to the parent, so any line there is a forgery.
    """

    def __init__(self, config: EvalConfig, server: ForkServer | None = None):
        ref_end, cand_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.ref = Worker(config, "reference", ref_end.fileno(), server)
            try:
                self.cand = Worker(config, "candidate", cand_end.fileno(), server)
            except BaseException:
                self.ref.dispose()
                raise
        finally:
            ref_end.close()
            cand_end.close()
        self.server = server

    def wait_ready(self, timeout_s: float) -> str | None:
        return self.ref.wait_ready(timeout_s) or self.cand.wait_ready(timeout_s)

    def run(self, ref_job: dict, cand_job: dict, timeout_s: float) -> tuple[dict | None, str, str]:
        """Send both jobs; returns ``(result | None, failure_kind, failure_message)`` (kinds: timeout,
        crashed for the reference process's death, suspicious for a forged line)."""
        nonce = ref_job["nonce"]
        self.ref.send_job(ref_job)
        self.cand.send_job(cand_job)
        deadline = time.monotonic() + timeout_s
        forged = False
        watching = {self.ref.read_fd: self.ref, self.cand.read_fd: self.cand}
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                where = self.ref.phase
                tail = self.cand.log_tail()
                return None, "timeout", f"no result within timeout_s={timeout_s:g} s (during {where}); {tail}"
            ready, _, _ = select.select(list(watching), [], [], min(left, 1.0))
            for fd in ready:
                worker = watching[fd]
                lines, eof = worker.read_available()
                if eof:
                    del watching[fd]
                    if worker is self.ref:
                        why = f"{self.ref.exit_reason()}; {self.ref.log_tail()}"
                        return None, "crashed", f"the reference process died during {self.ref.phase} ({why})"
                for line in lines:
                    try:
                        msg = json.loads(line)
                    except ValueError:
                        msg = None
                    if isinstance(msg, dict) and "phase" in msg and len(msg) == 1:
                        worker.phase = str(msg["phase"])[:200]
                    elif worker is self.cand:
                        forged = True
                    elif (
                        isinstance(msg, dict)
                        and msg.get("nonce") == nonce
                        and isinstance(msg.get("result"), dict)
                    ):
                        forged = forged or self._forged_late()
                        channel = "the candidate wrote on the evaluator's result channel"
                        return (None, "suspicious", channel) if forged else (msg["result"], "", "")

    def _forged_late(self) -> bool:
        """Lines the candidate worker wrote that are still unread (non-blocking)."""
        if self.cand.read_fd < 0:
            return False
        ready, _, _ = select.select([self.cand.read_fd], [], [], 0)
        if not ready:
            return False
        lines, _eof = self.cand.read_available()
        return bool(lines) or bool(self.cand._buf.strip())

    def dispose(self) -> None:
        self.cand.kill()
        self.ref.kill()
        self.cand.dispose()
        self.ref.dispose()


def _is_result(msg, nonce: str) -> bool:
    return isinstance(msg, dict) and msg.get("nonce") == nonce and isinstance(msg.get("result"), dict)


def worker_env(config: EvalConfig, tmp: Path, role: str = "reference") -> dict[str, str]:
    """The scrubbed environment of a worker: only what torch, nvcc and the task need (the candidate's
    has no ``PYTHONPATH``: the evaluator's package is not on its path)."""
    env = {k: v for k, v in os.environ.items() if k in PASSTHROUGH_ENV or k.startswith(PASSTHROUGH_PREFIXES)}
    bin_dir = str(Path(sys.executable).parent)  # ninja (for load_inline) lives beside the interpreter
    path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    cuda_home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    extra = [bin_dir] + ([os.path.join(cuda_home, "bin")] if cuda_home else [])
    env.update(
        PATH=os.pathsep.join(extra + [path]),
        HOME=str(tmp),
        TMPDIR=str(tmp),
        TORCH_EXTENSIONS_DIR=str(tmp / "torch_ext"),
        TRITON_CACHE_DIR=str(tmp / "triton"),
        XDG_CACHE_HOME=str(tmp / "cache"),
        PYTHONDONTWRITEBYTECODE="1",
        AUTOPROFILER_TASK_SIZE=config.task_size,
    )
    if role != "candidate":
        env["PYTHONPATH"] = str(PACKAGE_ROOT)
    # torch.compile compiles in the worker's own process: inductor's pool of compile workers would still
    # be importing torch (busy) in the quiet window before timing, and every compiled candidate would be
    # flagged for its child processes. Every role gets it, the fork server too: inductor's config reads
    # it once, when the server imports torch._dynamo, and a forked candidate inherits what it read.
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    env.setdefault("LANG", "C.UTF-8")
    if config.device == "cpu":
        # glibc's malloc adapts its mmap threshold and trims the heap top as a run goes, so one of two
        # identical models can end up faulting in fresh pages for its temporaries on every call while
        # the other reuses freed heap memory (a 4x identity "speedup" was seen on a 3 MB temporary).
        # Fixed thresholds: blocks below 32 MB always come from the heap and are reused, none are trimmed.
        env.setdefault("MALLOC_MMAP_THRESHOLD_", str(32 * 2**20))
        env.setdefault("MALLOC_TRIM_THRESHOLD_", str(2**40))
        # One intra-op thread unless the caller says otherwise: on a loaded 2-CPU machine torch's default
        # threads stall in ~8 ms steps (an identity "speedup" of 7.7x was seen on l1/relu), while one
        # thread gave 45/45 suite tasks within 1.00 +/- 0.03 (bench/results/eval_throughput_cpu.md).
        env.setdefault("OMP_NUM_THREADS", "1")
    return env
