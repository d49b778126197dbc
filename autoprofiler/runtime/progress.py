"""A progress bar for long loops: count, rate and ETA on stderr (tqdm), quiet when asked.

with Progress(total=len(cells), desc="cells") as bar:
    for _ in cells:
        bar.update(1)
"""

from __future__ import annotations

import sys

__all__ = ["Progress"]


class Progress:
    """A counted progress bar (tqdm when installed; a line per 10% otherwise). ``enabled=False``: silent."""

    def __init__(self, total: int, desc: str, enabled: bool = True, unit: str = "cell"):
        self.total = int(total)
        self.desc = desc
        self.done = 0
        self._bar = None
        self._printed = -1
        self.enabled = enabled and total > 0
        if not self.enabled:
            return
        try:
            from tqdm import tqdm
        except ImportError:  # the GPU machine may lack tqdm: plain lines instead
            return
        self._bar = tqdm(
            total=self.total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, mininterval=1.0
        )

    def update(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        tenth = self.done * 10 // self.total
        if tenth > self._printed:
            self._printed = tenth
            print(f"{self.desc}: {self.done}/{self.total}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
