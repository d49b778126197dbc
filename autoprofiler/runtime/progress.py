"""Progress for long loops: count, rate and ETA on stderr, labelled by the stage a script is in.

    with stage("probe sweep"):                       # bars opened inside read "probe sweep: cells"
        with Progress(total=len(cells), desc="cells") as bar:
            for _ in cells:
                bar.update(1)
                bar.write("one line per item")       # printed above the bar, never inside it

On a terminal the bar is tqdm's (redrawn in place, removed when done). Anywhere else (a log file, a
pipe, CI) a redrawn bar would leave ``\\r`` debris, so plain lines come instead: one at most every
``LINE_SECONDS`` while the loop runs, and one when it ends (count, rate, elapsed, ETA), unless it ended
within ``QUIET_SECONDS``.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
import time
from collections.abc import Iterator

__all__ = ["LINE_SECONDS", "QUIET_SECONDS", "Progress", "current_stage", "stage"]

#: Plain-line mode: at most one progress line per this many seconds, and a final one for a loop that
#: took at least ``QUIET_SECONDS`` (quicker loops, such as a replay answering from its table, stay quiet).
LINE_SECONDS = 10.0
QUIET_SECONDS = 2.0

_STAGE: contextvars.ContextVar[str] = contextvars.ContextVar("autoprofiler_progress_stage", default="")
_WRITE_LOCK = threading.Lock()  # one writer: lines and bar updates never interleave


@contextlib.contextmanager
def stage(label: str) -> Iterator[None]:
    """Name what the bars opened inside this block belong to (``"probe sweep: cells 4/20"``)."""
    token = _STAGE.set(label)
    try:
        yield
    finally:
        _STAGE.reset(token)


def current_stage() -> str:
    """The label set by the innermost ``stage`` block ("" outside any)."""
    return _STAGE.get()


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes} min {secs:02d} s"


class Progress:
    """A counted progress bar (see the module docstring). ``enabled=False`` (or ``total`` 0): silent,
    except ``write``, which always prints.

    Args:
        total: items the loop will count.
        desc: what is counted ("cells", "tasks"); prefixed by the current ``stage``.
        enabled: show progress at all.
        unit: the unit in the rate ("cell/s").
        tty: force the terminal bar (True) or plain lines (False); default: whether stderr is a terminal.
    """

    def __init__(
        self, total: int, desc: str, enabled: bool = True, unit: str = "cell", tty: bool | None = None
    ):
        label = current_stage()
        self.total = int(total)
        self.desc = f"{label}: {desc}" if label else desc
        self.unit = unit
        self.done = 0
        self.enabled = enabled and self.total > 0
        self._bar = None
        self._started = time.monotonic()
        self._last_line = self._started
        self._printed = False
        if not self.enabled:
            return
        if tty is None:
            tty = sys.stderr.isatty()
        if tty:
            try:
                from tqdm import tqdm
            except ImportError:  # a bare GPU image may lack tqdm: plain lines instead
                return
            self._bar = tqdm(
                total=self.total,
                desc=self.desc,
                unit=unit,
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.5,
                leave=False,
            )

    def line(self) -> str:
        """``"<desc> 4/20 (20%), 0.5 cell/s, 8 s elapsed, ETA 32 s"``."""
        elapsed = time.monotonic() - self._started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        text = f"{self.desc} {self.done}/{self.total} ({self.done / self.total:.0%}), "
        text += f"{rate:.2g} {self.unit}/s, {_duration(elapsed)} elapsed"
        if 0 < self.done < self.total and rate > 0:
            text += f", ETA {_duration((self.total - self.done) / rate)}"
        return text

    def update(self, n: int = 1) -> None:
        self.done += n
        if not self.enabled:
            return
        with _WRITE_LOCK:
            if self._bar is not None:
                self._bar.update(n)
                return
            now = time.monotonic()
            finished = self.done >= self.total
            if (finished and (self._printed or now - self._started >= QUIET_SECONDS)) or (
                not finished and now - self._last_line >= LINE_SECONDS
            ):
                self._last_line = now
                self._printed = True
                print(self.line(), file=sys.stderr, flush=True)

    def write(self, text: str) -> None:
        """Print ``text`` on stdout as whole lines, above the bar (tqdm clears and redraws it)."""
        with _WRITE_LOCK:
            if self._bar is not None:
                self._bar.write(text, file=sys.stdout)
            else:
                print(text, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            with _WRITE_LOCK:
                self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
