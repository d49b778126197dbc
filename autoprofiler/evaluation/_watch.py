"""What the reference process knows of the candidate's process, from outside it (``_reference.py``).

``ProcessWatch`` reads the kernel's view of the candidate's process and its descendants (``/proc``,
process CPU clocks): nothing the candidate does in Python changes what it reports. ``SharedCores`` puts
both processes on the same CPU cores while timing (cores other evaluations of the host are not timing
on); ``TimingLock`` is the ``timing_lock`` file lock.
Loaded by path beside ``_harness.py`` (standard library only).
"""

from __future__ import annotations

import os
import signal
import time

from _autoprofiler_harness import Failure

QUIET_S = 0.005  # the quiet window before timing
QUIET_BUSY = 0.25  # share of the quiet window a thread or child may use
SECOND_LOOK_S = 0.1  # a busy first window is looked at again this much later


class ProcessWatch:
    """The candidate's process and its descendants, seen through the kernel (``/proc``, CPU clocks).

    Nothing here runs inside the candidate's process, so nothing the candidate does in Python changes
    what it reports. Descendants are found through ``/proc/<pid>/task/<tid>/children``; a process that
    both leaves the tree (double fork) and the session escapes it (a PID namespace or cgroup would not
    let it).
    """

    def __init__(self, pid: int):
        self.pid = pid

    def cpu(self, pid: int | None = None) -> float:
        """CPU seconds used so far by all threads of ``pid`` (default: the candidate's process)."""
        pid = self.pid if pid is None else pid
        try:
            return time.clock_gettime(((~pid) << 3) | 2)  # the process's CPU clock (CPUCLOCK_SCHED)
        except OSError:
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, IndexError, ValueError):
                return 0.0

    def descendants(self) -> list[int]:
        """Live (not zombie) descendants of the candidate's process."""
        found, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            try:
                tids = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tids:
                try:
                    with open(f"/proc/{pid}/task/{tid}/children") as fh:
                        children = [int(c) for c in fh.read().split()]
                except (OSError, ValueError):
                    continue
                for child in children:
                    if child not in found and _state(child) not in ("Z", "X", ""):
                        found.append(child)
                        todo.append(child)
        return found

    def pin(self, cpus: list[int]) -> None:
        """Every thread of the candidate's process on ``cpus``."""
        pin_threads(self.pid, cpus)

    def kill(self, pids: list[int]) -> None:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def describe(self, pid: int) -> str:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:
            cmd = "?"
        return f"pid {pid}: {cmd[:80]}"

    def runnable(self, pid: int) -> list[int]:
        """Threads of ``pid`` that are running or waiting for a CPU (state ``R``)."""
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return []
        return [int(tid) for tid in tids if _state(pid, tid) == "R"]

    def quiet_window(self) -> int:
        """Watch the waiting candidate process and its children for ``QUIET_S``: a thread that is
        runnable in two of three looks (a scheduling fact, whatever the machine's load) or that used
        more than ``QUIET_BUSY`` of the window is ``suspicious``, if it is so again in a second window
        ``SECOND_LOOK_S`` later (on a loaded host an honest thread pool's spin-wait can still be
        runnable at the first; a thread that competes with the reference is at both). Idle children
        are killed. Returns how many children were killed."""
        time.sleep(0.002)  # let a thread pool's spin-wait after the last call run out
        children, busy, used = self.look()
        if busy:
            time.sleep(SECOND_LOOK_S)
            children, busy, used = self.look()
        if self.pid in busy:
            raise Failure(
                "suspicious",
                f"the candidate's thread(s) kept running ({used[self.pid] * 1e3:.1f} ms of CPU in a "
                f"{QUIET_S * 1e3:.0f} ms window before timing, as in one {SECOND_LOOK_S * 1e3:.0f} ms "
                "before it) while its process waited for the next request: they would compete with the "
                "reference",
            )
        if busy:
            who = self.describe(busy[0])
            self.kill(children)
            raise Failure(
                "suspicious",
                f"the candidate's child process ({who}) kept running ("
                f"{used[busy[0]] * 1e3:.1f} ms of CPU in a {QUIET_S * 1e3:.0f} ms window before timing): it "
                "would compete with the reference",
            )
        self.kill(children)
        return len(children)

    def look(self) -> tuple[list[int], list[int], dict[int, float]]:
        """One quiet window: the candidate's children, the processes (it or a child) that were busy in
        it, and the CPU seconds each used."""
        children = self.descendants()
        pids = [self.pid, *children]
        before = {pid: self.cpu(pid) for pid in pids}
        looks: dict[int, int] = {}
        for look in range(3):
            if look:
                time.sleep(QUIET_S / 2)
            for pid in pids:
                if self.runnable(pid):
                    looks[pid] = looks.get(pid, 0) + 1
        used = {pid: self.cpu(pid) - cpu for pid, cpu in before.items()}
        busy = [pid for pid in pids if looks.get(pid, 0) >= 2 or used[pid] > QUIET_BUSY * QUIET_S]
        return children, busy, used


def _state(pid: int, tid: int | None = None) -> str:
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def minor_faults(pid: int) -> int:
    """Minor page faults of process ``pid`` so far (``/proc/<pid>/stat`` field 10), 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[7])
    except (OSError, IndexError, ValueError):
        return 0


def pin_threads(pid: int, cpus) -> None:
    """Every thread of process ``pid`` (``sched_setaffinity`` on a pid sets one thread's mask only) on
    ``cpus``; threads that are gone or refuse are left as they are."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass


class SharedCores:
    """Both processes on the same CPU cores while timing (the reference process's current ones: how many
    is ``EvalConfig.timing_cores``), every thread of each, so neither times on a faster or less loaded
    core than the other and the helper threads of each (CUDA's, the intra-op pool) share the cores
    as the other's do. The reference process gets its own mask back after.

    ``claims`` (``EvalConfig.core_claims``): a directory in which the reference processes of one host
    claim the cores they time on (a non-blocking ``flock`` on ``core<N>.lock`` per core), so evaluations
    timing at once on different GPUs take different cores; ``shared`` counts the cores that had to be
    taken although another evaluation held them (every allowed core was claimed).
    """

    def __init__(self, watch: ProcessWatch | None, threads: int, claims: str | None = None):
        self.watch = watch
        self.threads = max(1, threads)
        self.claims = claims
        self.held: list = []  # the claim files' open handles, released on exit
        self.saved = None
        self.cpus: list[int] = []
        self.shared = 0

    def __enter__(self):
        try:
            allowed = sorted(os.sched_getaffinity(0))
            here = _current_cpu()
            order = ([here] if here in allowed else []) + [c for c in allowed if c != here]
            self.cpus = self.claim(order) if self.claims else order[: self.threads]
            self.saved = set(allowed)
            pin_threads(os.getpid(), self.cpus)
            if self.watch is not None:
                self.watch.pin(self.cpus)
        except OSError:
            self.cpus = []
        return self

    def claim(self, order: list[int]) -> list[int]:
        """The first ``threads`` cores of ``order`` no other evaluation holds, each claimed; topped up
        with held ones (counted in ``shared``) when too few are free."""
        import fcntl

        mine: list[int] = []
        for cpu in order:
            if len(mine) == self.threads:
                break
            try:
                fh = open(os.path.join(self.claims, f"core{cpu}.lock"), "a")  # noqa: SIM115 - held
            except OSError:
                continue
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                fh.close()
                continue
            self.held.append(fh)
            mine.append(cpu)
        extra = [c for c in order if c not in mine][: self.threads - len(mine)]
        self.shared = len(extra)
        return mine + extra

    def __exit__(self, *exc):
        if self.saved:
            pin_threads(os.getpid(), self.saved)
        for fh in self.held:  # closing the file releases its flock
            fh.close()
        self.held = []
        return False


def _current_cpu() -> int:
    try:
        with open("/proc/self/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return -1


class TimingLock:
    """``fcntl.flock`` on ``path`` while timing (no-op when ``path`` is None)."""

    def __init__(self, path: str | None):
        self.path = path
        self.fh = None

    def acquire(self) -> None:
        if self.path and self.fh is None:
            import fcntl

            self.fh = open(self.path, "a")  # noqa: SIM115 - held across the block
            fcntl.flock(self.fh, fcntl.LOCK_EX)

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        if self.fh is not None:
            import fcntl

            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()
        return False
