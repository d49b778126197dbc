"""The tuning / held-out split of tasks by content hash, fixed before any playbook rule was written.

The playbook rewriter's thresholds (``autoprofiler.rewriters.playbook``) and the experience rewriter's
training rows (``autoprofiler.rewriters.experience``) may use only *tuning* tasks; every other task is
*held out*: its outcomes are read only by the reachability report (``bench/rewriter_reachability.py``),
which reports both splits separately. A task is a tuning task when

    int(sha256(f"{SPLIT_SALT}:{task_hash}").hexdigest()[:8], 16) % 3 == 0

i.e. about a third of any suite, decided by the task's content hash alone (no id, no outcome, no
profile), so a new task falls on a side without anyone choosing it. ``SPLIT_SALT`` is part of the
playbook's freeze: changing it re-draws the split and voids every held-out claim made with the old one.

Example::

    >>> is_tuning_task("e344ee2dfe07f7d7") in (True, False)
    True
    >>> tuning, held_out = split_hashes(["a", "b", "c"])
    >>> sorted(tuning + held_out)
    ['a', 'b', 'c']
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

SPLIT_SALT = "playbook-split-v1"
TUNING_MODULUS = 3  # one task in TUNING_MODULUS is a tuning task


def is_tuning_task(task_hash: str) -> bool:
    """True when the task of this content hash is in the tuning split (see the module docstring)."""
    if not isinstance(task_hash, str) or not task_hash:
        raise ValueError(f"expected a task content hash (non-empty str), got {task_hash!r}")
    digest = hashlib.sha256(f"{SPLIT_SALT}:{task_hash}".encode()).hexdigest()
    return int(digest[:8], 16) % TUNING_MODULUS == 0


def split_hashes(task_hashes: Iterable[str]) -> tuple[list[str], list[str]]:
    """``(tuning, held_out)`` hashes, each in the given order."""
    tuning: list[str] = []
    held_out: list[str] = []
    for task_hash in task_hashes:
        (tuning if is_tuning_task(task_hash) else held_out).append(task_hash)
    return tuning, held_out


def split_name(task_hash: str) -> str:
    """``"tuning"`` or ``"held_out"``."""
    return "tuning" if is_tuning_task(task_hash) else "held_out"
