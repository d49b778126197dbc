"""Memory reservations of the evaluations that share one device (``EvalConfig.memory_ledger``).

Each evaluation's reference process plans its memory against what the device has free when it
measures (``_memory.measure_budget``). Several evaluations started together on one GPU each see the
memory the others have not allocated yet, and together they can plan more than the device has. With
a ledger, each reference process writes down what its plan holds; a later plan counts what the live
others wrote down and, when its task fits the device alone but not beside them, waits for one to
finish.

The ledger is one JSON file of ``{"<pid>:<start time>": bytes}``, read and rewritten under ``flock``;
an entry whose process is gone (its start time no longer matches, so a reused pid does not count) is
dropped by the next reader, so a killed evaluation frees its reservation without cleaning up.
Loaded by path beside ``_harness.py`` (standard library only).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "ledger.json")
    >>> with Ledger(path) as book:
    ...     book.others(), book.reserve(5 * 2**30)
    (0, None)
    >>> with Ledger(path) as book:
    ...     book.others()  # this process's own reservation is not another's
    0
"""

from __future__ import annotations

import fcntl
import json
import os

__all__ = ["Ledger", "process_key"]


def process_key(pid: int) -> str | None:
    """``"<pid>:<start time>"`` of a live process (start time in clock ticks since boot, from
    ``/proc/<pid>/stat``), ``None`` when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return f"{pid}:{fields[19]}"  # field 22 of the line: starttime


class Ledger:
    """The reservations on one device, locked while open (``with Ledger(path) as book``)."""

    def __init__(self, path: str):
        self.path = path
        self.me = process_key(os.getpid())
        self.entries: dict[str, int] = {}
        self.fh = None

    def __enter__(self) -> Ledger:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self.fh = os.fdopen(fd, "r+")
        fcntl.flock(self.fh, fcntl.LOCK_EX)
        try:
            raw = json.loads(self.fh.read() or "{}")
        except ValueError:
            raw = {}  # a torn or foreign file: start again (its processes re-reserve on their next plan)
        self.entries = {
            key: int(size)
            for key, size in (raw.items() if isinstance(raw, dict) else [])
            if isinstance(size, int)
            and key.partition(":")[0].isdigit()
            and process_key(int(key.partition(":")[0])) == key
        }
        return self

    def __exit__(self, *exc) -> bool:
        try:
            self.fh.seek(0)
            self.fh.truncate()
            self.fh.write(json.dumps(self.entries))
            self.fh.flush()
        finally:
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()
            self.fh = None
        return False

    def others(self) -> int:
        """Bytes reserved by the other live evaluations."""
        return sum(size for key, size in self.entries.items() if key != self.me)

    def count(self) -> int:
        """How many other live evaluations hold a reservation."""
        return sum(1 for key in self.entries if key != self.me)

    def reserve(self, size: int) -> None:
        """Reserve ``size`` bytes for this process (replacing its earlier reservation)."""
        if self.me is not None:
            self.entries[self.me] = int(size)

    def release(self) -> None:
        self.entries.pop(self.me, None)
